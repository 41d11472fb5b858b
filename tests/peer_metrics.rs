//! The `/metrics` series of a peer that left its route: kept with their
//! last values for `peer_metrics_grace`, so a scrape sees them, then
//! removed, so a deployment that rolls its engines (new pod names, new
//! addresses every time) does not grow `/metrics` without bound.

mod common;

use common::http;
use common::*;

/// Every sample line of `/metrics` that names `peer`.
fn series_of(gw: &Gateway, peer: &str) -> Vec<String> {
    let label = format!("peer=\"{peer}\"");
    http::get(gw.admin, "/metrics")
        .text()
        .lines()
        .filter(|l| !l.starts_with('#') && l.contains(&label))
        .map(str::to_string)
        .collect()
}

#[test]
fn a_gone_peers_series_stay_through_the_grace_period_then_go_and_a_live_peers_stay() {
    let cluster = engines(2);
    let p = ports(&cluster);
    let gw = Gateway::start_with(
        &[("chat", route_yaml(&p, ""))],
        GatewayOptions {
            extra_config: "peer_metrics_grace: 3s\n".into(),
            watch: Some(false),
            ..Default::default()
        },
    );
    let served =
        |peer: &str| gw.metric("llm_gateway_requests_total", &[&format!("peer=\"{peer}\"")]);
    // New sessions go to the engine with the fewest: both get some.
    let mut i = 0;
    wait_for("requests on both engines", DEADLINE, || {
        i += 1;
        served_by(&gw, &format!("peer-metrics-{i}"), 0);
        (served("e0") > 0.0 && served("e1") > 0.0).then_some(())
    });
    // A request that reaches no peer counts under the route's `-`.
    let refused = http::post_json(
        gw.addr,
        "/chat/v1/chat/completions",
        &[],
        &serde_json::json!([]),
    );
    assert_eq!(refused.status(), 400);
    wait_for("the unplaced request counted", DEADLINE, || {
        (!series_of(&gw, "-").is_empty()).then_some(())
    });
    let (e0_before, e1_before) = (series_of(&gw, "e0"), series_of(&gw, "e1"));
    let unplaced = series_of(&gw, "-");
    // The series counted on the request path; the in-flight, readiness and
    // bindings gauges are filled at each scrape from the routes, so a gone
    // peer leaves those at once.
    let counted = |lines: &[String]| -> Vec<String> {
        lines
            .iter()
            .filter(|l| {
                !l.starts_with("llm_gateway_in_flight")
                    && !l.starts_with("llm_gateway_peer_ready")
                    && !l.starts_with("llm_gateway_session_bindings")
            })
            .cloned()
            .collect()
    };

    // e1 leaves the route.
    gw.write_route("chat", &route_yaml(&p[..1], ""));
    gw.reload();
    // Within its grace period: every series as it last was.
    assert_eq!(
        counted(&series_of(&gw, "e1")),
        counted(&e1_before),
        "gone before its grace ran out"
    );
    // Then gone, all of them.
    wait_for("e1's series to be removed", DEADLINE, || {
        series_of(&gw, "e1").is_empty().then_some(())
    });
    assert!(
        gw.log().contains("series of peers gone from their routes"),
        "{}",
        gw.log()
    );
    // Control: e0, still in the route, keeps every series it had (no
    // request since), and so does the route's `-`.
    assert_eq!(counted(&series_of(&gw, "e0")), counted(&e0_before));
    assert!(!counted(&e0_before).is_empty() && !counted(&e1_before).is_empty());
    assert_eq!(series_of(&gw, "-"), unplaced);
}
