//! Human-friendly units in config files: durations ("30s", "500ms", "30m",
//! "24h", read by humantime, or a bare number of seconds), byte sizes ("10m", "512k", "1g", or a
//! bare number of bytes) and lenient booleans.

use serde::de::{self, Deserializer, Visitor};
use std::fmt;
use std::time::Duration;

/// A duration written as `500ms`, `30s`, `5m`, `2h`, `1d` or a bare number of seconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Dur(pub Duration);

/// A byte size written as `512k`, `10m`, `1g` (binary multiples, case-insensitive,
/// optional trailing `b`/`ib`) or a bare number of bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Size(pub u64);

/// A boolean that also accepts yes/no, on/off and 1/0 in any case. A plain
/// truthiness test once read the string "False" as on; this refuses anything
/// it does not recognise instead.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Flag(pub bool);

/// `value` where the file set it, else `default`.
pub(crate) fn flag(value: Option<Flag>, default: bool) -> bool {
    value.map(|f| f.0).unwrap_or(default)
}

/// A duration as humantime reads it (`500ms`, `30s`, `5m`, `2h`, `1d`,
/// `1h 30m`); a bare number is seconds, as YAML users write `timeout: 5`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    let parsed = match t.parse::<f64>() {
        Ok(secs) if secs.is_finite() && secs >= 0.0 => Duration::try_from_secs_f64(secs).ok(),
        Ok(_) => None,
        Err(_) => humantime::parse_duration(t).ok(),
    };
    let d = parsed
        .ok_or_else(|| format!("invalid duration {text:?} (expected e.g. 500ms, 30s, 5m, 2h)"))?;
    if d > Duration::from_secs(365 * 86400) {
        return Err(format!("duration {text:?} out of range"));
    }
    Ok(d)
}

pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim().to_ascii_lowercase();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let value: u64 = num
        .parse()
        .map_err(|_| format!("invalid size {text:?} (expected e.g. 512k, 10m, 1g)"))?;
    let unit = unit.trim();
    let unit = unit
        .strip_suffix("ib")
        .or_else(|| unit.strip_suffix('b'))
        .unwrap_or(unit);
    let mult: u64 = match unit {
        "" => 1,
        "k" => 1 << 10,
        "m" => 1 << 20,
        "g" => 1 << 30,
        other => return Err(format!("unknown size unit {other:?} in {text:?}")),
    };
    value
        .checked_mul(mult)
        .ok_or_else(|| format!("size {text:?} out of range"))
}

pub fn parse_flag(text: &str) -> Option<bool> {
    match text.trim().to_ascii_lowercase().as_str() {
        "true" | "yes" | "on" | "1" => Some(true),
        "false" | "no" | "off" | "0" => Some(false),
        _ => None,
    }
}

impl<'de> serde::Deserialize<'de> for Dur {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Dur;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a duration such as 500ms, 30s, 5m or a number of seconds")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Dur, E> {
                parse_duration(&v.to_string()).map(Dur).map_err(E::custom)
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Dur, E> {
                parse_duration(&v.to_string()).map(Dur).map_err(E::custom)
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Dur, E> {
                parse_duration(&v.to_string()).map(Dur).map_err(E::custom)
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Dur, E> {
                parse_duration(v).map(Dur).map_err(E::custom)
            }
        }
        d.deserialize_any(V)
    }
}

impl<'de> serde::Deserialize<'de> for Size {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Size;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a size such as 512k, 10m, 1g or a number of bytes")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Size, E> {
                Ok(Size(v))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Size, E> {
                u64::try_from(v)
                    .map(Size)
                    .map_err(|_| E::custom("size must not be negative"))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Size, E> {
                parse_size(v).map(Size).map_err(E::custom)
            }
        }
        d.deserialize_any(V)
    }
}

impl<'de> serde::Deserialize<'de> for Flag {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Flag;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a boolean (true/false, yes/no, on/off, 1/0)")
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<Flag, E> {
                Ok(Flag(v))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Flag, E> {
                self.visit_str(&v.to_string())
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Flag, E> {
                self.visit_str(&v.to_string())
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Flag, E> {
                match parse_flag(v) {
                    Some(b) => {
                        log::warn!("config: boolean written as {v:?}; prefer true/false");
                        Ok(Flag(b))
                    }
                    None => Err(E::custom(format!(
                        "{v:?} is not a boolean (true/false, yes/no, on/off, 1/0)"
                    ))),
                }
            }
        }
        d.deserialize_any(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("30s").unwrap(), Duration::from_secs(30));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("30m").unwrap(), Duration::from_secs(1800));
        assert_eq!(parse_duration("24h").unwrap(), Duration::from_secs(86400));
        assert_eq!(parse_duration("2").unwrap(), Duration::from_secs(2));
        assert!(parse_duration("5 fortnights").is_err());
        assert!(parse_duration("").is_err());
        assert!(parse_duration("-1s").is_err());
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("10m").unwrap(), 10 << 20);
        assert_eq!(parse_size("20M").unwrap(), 20 << 20);
        assert_eq!(parse_size("512kb").unwrap(), 512 << 10);
        assert_eq!(parse_size("1GiB").unwrap(), 1 << 30);
        assert_eq!(parse_size("123").unwrap(), 123);
        assert!(parse_size("10q").is_err());
        assert!(parse_size("99999999999999999999g").is_err());
    }

    #[test]
    fn flags() {
        for t in ["true", "Yes", "ON", "1"] {
            assert_eq!(parse_flag(t), Some(true), "{t}");
        }
        for t in ["false", "No", "off", "0", "False"] {
            assert_eq!(parse_flag(t), Some(false), "{t}");
        }
        assert_eq!(parse_flag("maybe"), None);
    }
}
