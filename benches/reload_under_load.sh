#!/usr/bin/env bash
# The full reload-under-load run (issue 12): eight clients stream through
# the gateway for two minutes while the route file is rewritten and reloaded
# by SIGHUP and by the file watch in turn (a broken file every tenth round),
# at least 100 reloads in all. Fails on any failed request, truncated stream,
# PID change or request left in flight, and prints one line of figures.
# The 30-second version runs with the test suite
# (tests/reload_under_load.rs); this is its `--ignored` twin.
#
#   bash benches/reload_under_load.sh
#
# Everything listens on 127.0.0.1 and stops with the test.
set -euo pipefail
cd "$(dirname "$0")/.."
exec cargo test --test reload_under_load streams_survive_reloads_full_two_minutes \
  -- --ignored --nocapture
