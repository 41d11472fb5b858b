//! Byte-level JSON primitives shared by the walkers that read request and
//! response bodies without parsing them.

#[cfg(test)]
pub(crate) mod testing {
    //! Random JSON text: any value, spelled with random whitespace and
    //! escapes, for proptests that hold a byte walker to serde_json.

    use proptest::prelude::*;
    use serde_json::{json, Value};

    pub(crate) fn value_strategy() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(|n| json!(n)),
            any::<u64>().prop_map(|n| json!(n)),
            // Quarter steps are exact in binary, so text round-trips exactly.
            (-4000i32..4000).prop_map(|n| json!(f64::from(n) / 4.0)),
            any::<String>().prop_map(Value::String),
            "[a-z\"\\\\/\u{e9}\u{1f600}\n\t ]{0,10}".prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 48, 6, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                proptest::collection::vec((key_strategy(), inner), 0..6)
                    .prop_map(|kv| Value::Object(kv.into_iter().collect())),
            ]
        })
    }

    pub(crate) fn key_strategy() -> impl Strategy<Value = String> {
        prop_oneof![
            "[a-z_]{0,8}",
            any::<String>(),
            Just("stream_options".to_string()),
            Just("include_usage".to_string()),
        ]
    }

    /// Writes JSON with random whitespace and random (valid) escaping,
    /// driven by a small deterministic generator seeded by proptest.
    pub(crate) struct Writer {
        pub(crate) out: String,
        pub(crate) seed: u64,
    }

    impl Writer {
        fn roll(&mut self, n: u64) -> u64 {
            self.seed ^= self.seed << 13;
            self.seed ^= self.seed >> 7;
            self.seed ^= self.seed << 17;
            self.seed % n
        }

        pub(crate) fn ws(&mut self) {
            for _ in 0..self.roll(4).saturating_sub(1) {
                let c = [' ', '\n', '\t', '\r'][self.roll(4) as usize];
                self.out.push(c);
            }
        }

        pub(crate) fn string(&mut self, s: &str) {
            self.out.push('"');
            for c in s.chars() {
                let must = matches!(c, '"' | '\\') || (c as u32) < 0x20;
                if must || self.roll(6) == 0 {
                    match (c, self.roll(2)) {
                        ('"', 0) => self.out.push_str("\\\""),
                        ('\\', 0) => self.out.push_str("\\\\"),
                        ('/', 0) => self.out.push_str("\\/"),
                        ('\n', 0) => self.out.push_str("\\n"),
                        _ => {
                            let mut buf = [0u16; 2];
                            for unit in c.encode_utf16(&mut buf) {
                                self.out.push_str(&format!("\\u{unit:04x}"));
                            }
                        }
                    }
                } else {
                    self.out.push(c);
                }
            }
            self.out.push('"');
        }

        pub(crate) fn value(&mut self, v: &Value) {
            match v {
                Value::String(s) => self.string(s),
                Value::Array(a) => {
                    self.out.push('[');
                    for (i, x) in a.iter().enumerate() {
                        if i > 0 {
                            self.out.push(',');
                        }
                        self.ws();
                        self.value(x);
                        self.ws();
                    }
                    self.ws();
                    self.out.push(']');
                }
                Value::Object(m) => {
                    self.out.push('{');
                    for (i, (k, x)) in m.iter().enumerate() {
                        if i > 0 {
                            self.out.push(',');
                        }
                        self.ws();
                        self.string(k);
                        self.ws();
                        self.out.push(':');
                        self.ws();
                        self.value(x);
                        self.ws();
                    }
                    self.ws();
                    self.out.push('}');
                }
                other => self.out.push_str(&other.to_string()),
            }
        }
    }
}
