//! The tenants file (gateway.yaml `tenants_file`) → [`TenantsConfig`]: per
//! tenant a weight, a priority class and the classes it may ask for, token
//! and request limits per minute, a cap on requests in flight; a
//! `defaults:` block for every tenant the file does not name. Reloaded
//! with the routes (`Registry::reload`); a file that fails here keeps the
//! previous version, as a route file does.
//!
//! The budgets and the in-flight cap are enforced now (`tenants/`); the
//! weight, the class and the allowed classes are read, checked and kept
//! for the fair-share release and the priority classes (issue 43's second
//! half), and shown in `/_tenants`.

use super::spans::KeyLines;
use super::ConfigError;
use crate::budget::Limits;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The classes when the file names none, highest first.
pub const DEFAULT_CLASSES: [&str; 3] = ["interactive", "standard", "batch"];
/// The class of a tenant that names none, when the classes have it.
pub const DEFAULT_CLASS: &str = "standard";
/// The label every tenant the file does not name is counted under in
/// `/metrics`, so a client choosing names cannot grow the series.
pub const OTHER_LABEL: &str = "other";
/// The longest tenant name kept (a key owner, a header's value).
pub const MAX_TENANT_NAME: usize = 128;
const MAX_WEIGHT: f64 = 1_000_000.0;

/// One tenant's policy, the defaults filled in.
#[derive(Debug, Clone, PartialEq)]
pub struct TenantPolicy {
    /// Its share of tokens served against the others' under contention
    /// (the fairness half's; kept and shown now).
    pub weight: f64,
    /// The class its requests are in when they ask for none (fairness half).
    pub class: String,
    /// The classes its requests may ask for (fairness half).
    pub allowed_classes: Vec<String>,
    /// Token and request limits per minute (`None`: unlimited).
    pub limits: Limits,
    /// Requests of this tenant in flight at most (`None`: no cap).
    pub max_in_flight: Option<u64>,
}

impl TenantPolicy {
    /// No limit and no cap: admission has nothing to check.
    pub fn is_unlimited(&self) -> bool {
        self.limits.is_unlimited() && self.max_in_flight.is_none()
    }
}

/// The tenants file as validated; `Default` is what runs without one
/// (every tenant on the defaults, which limit nothing).
#[derive(Debug, Clone, PartialEq)]
pub struct TenantsConfig {
    /// The file it was read from (`None`: no `tenants_file`).
    pub file: Option<PathBuf>,
    /// Priority classes, highest first.
    pub classes: Vec<String>,
    pub defaults: TenantPolicy,
    /// The tenants the file names: these, and only these, have their own
    /// `tenant` label in `/metrics`.
    pub tenants: BTreeMap<String, TenantPolicy>,
}

impl Default for TenantsConfig {
    fn default() -> Self {
        let classes: Vec<String> = DEFAULT_CLASSES.iter().map(|c| c.to_string()).collect();
        TenantsConfig {
            file: None,
            defaults: TenantPolicy {
                weight: 1.0,
                class: DEFAULT_CLASS.to_string(),
                allowed_classes: classes.clone(),
                limits: Limits::default(),
                max_in_flight: None,
            },
            classes,
            tenants: BTreeMap::new(),
        }
    }
}

impl TenantsConfig {
    /// `name`'s policy: its own, else the defaults.
    pub fn policy(&self, name: &str) -> &TenantPolicy {
        self.tenants.get(name).unwrap_or(&self.defaults)
    }

    /// Whether the file names `name` (it has its own metric label).
    pub fn names(&self, name: &str) -> bool {
        self.tenants.contains_key(name)
    }

    /// No tenant, named or not, has a limit or a cap.
    pub fn is_unlimited(&self) -> bool {
        self.defaults.is_unlimited() && self.tenants.values().all(TenantPolicy::is_unlimited)
    }

    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigError::new(path, None, format!("cannot read: {e}")))?;
        Self::parse(path, &text)
    }

    pub fn parse(path: &Path, text: &str) -> Result<Self, ConfigError> {
        let file: TenantsFile = if text.trim().is_empty() {
            TenantsFile::default()
        } else {
            serde_yaml::from_str(text).map_err(|e| ConfigError::from_yaml(path, e))?
        };
        let lines = KeyLines::of(text);
        let err = |at: &str, message: String| ConfigError::new(path, line_of(&lines, at), message);
        let classes = match file.classes {
            None => TenantsConfig::default().classes,
            Some(list) => {
                if list.is_empty() {
                    return Err(err("classes", "classes: name at least one".into()));
                }
                for (i, class) in list.iter().enumerate() {
                    if class.trim().is_empty() || list[..i].contains(class) {
                        return Err(err(
                            &format!("classes[{i}]"),
                            format!("classes: {class:?} is empty or named twice"),
                        ));
                    }
                }
                list
            }
        };
        let base = TenantPolicy {
            weight: 1.0,
            class: if classes.iter().any(|c| c == DEFAULT_CLASS) {
                DEFAULT_CLASS.to_string()
            } else {
                classes.last().cloned().unwrap_or_default()
            },
            allowed_classes: classes.clone(),
            limits: Limits::default(),
            max_in_flight: None,
        };
        let check = Checker {
            classes: &classes,
            err: &err,
        };
        let defaults_file = file.defaults.unwrap_or_default();
        let defaults = check.policy("defaults", &defaults_file, &base)?;
        let mut tenants = BTreeMap::new();
        for (name, entry) in file.tenants.unwrap_or_default() {
            let at = format!("tenants.{name}");
            if let Some(problem) = name_problem(&name) {
                return Err(err(&at, format!("tenant {name:?}: {problem}")));
            }
            let policy = check.policy(&at, &entry.unwrap_or_default(), &defaults)?;
            tenants.insert(name, policy);
        }
        Ok(TenantsConfig {
            file: Some(path.to_path_buf()),
            classes,
            defaults,
            tenants,
        })
    }
}

/// The line of `at`, else of the nearest section around it that is
/// written (a class inherited from the defaults that a tenant's own
/// `allowed_classes` leaves out is the tenant's mistake).
fn line_of(lines: &KeyLines, at: &str) -> Option<usize> {
    let mut at = at;
    loop {
        if let Some(line) = lines.line(at) {
            return Some(line);
        }
        at = at.rsplit_once('.')?.0;
    }
}

/// Why `name` cannot be a tenant's, if it cannot.
pub fn name_problem(name: &str) -> Option<&'static str> {
    if name.is_empty() || name.chars().count() > MAX_TENANT_NAME {
        return Some("a tenant name has 1 to 128 characters");
    }
    if name.chars().any(char::is_control) {
        return Some("a tenant name has no control characters");
    }
    if name == OTHER_LABEL {
        return Some("\"other\" is the metric label of every tenant the file does not name");
    }
    None
}

/// Each policy field checked against the classes, its errors at its line.
struct Checker<'a, E: Fn(&str, String) -> ConfigError> {
    classes: &'a [String],
    err: &'a E,
}

impl<E: Fn(&str, String) -> ConfigError> Checker<'_, E> {
    /// `entry` (at `at`) over `inherited`, field by field.
    fn policy(
        &self,
        at: &str,
        entry: &PolicyFile,
        inherited: &TenantPolicy,
    ) -> Result<TenantPolicy, ConfigError> {
        let err = self.err;
        let weight = entry.weight.unwrap_or(inherited.weight);
        if !(weight > 0.0 && weight <= MAX_WEIGHT) {
            return Err(err(
                &format!("{at}.weight"),
                format!("{at}.weight: {weight} is not between 0 (excluded) and 1000000"),
            ));
        }
        let known = |class: &String, key: &str| {
            if self.classes.contains(class) {
                Ok(())
            } else {
                Err(err(
                    &format!("{at}.{key}"),
                    format!(
                        "{at}.{key}: {class:?} is not one of the classes ({})",
                        self.classes.join(", ")
                    ),
                ))
            }
        };
        let allowed_classes = match &entry.allowed_classes {
            Some(list) => {
                list.iter().try_for_each(|c| known(c, "allowed_classes"))?;
                list.clone()
            }
            None => inherited.allowed_classes.clone(),
        };
        let class = entry.class.clone().unwrap_or(inherited.class.clone());
        known(&class, "class")?;
        if !allowed_classes.contains(&class) {
            return Err(err(
                &format!("{at}.class"),
                format!("{at}.class: {class:?} is not among its allowed_classes"),
            ));
        }
        let limit = |given: &Option<LimitFile>, key: &str, was: Option<u64>| match given {
            None => Ok(was),
            Some(LimitFile::Number(n)) if *n >= 1 => Ok(Some(*n)),
            Some(LimitFile::Word(w)) if w == "unlimited" => Ok(None),
            Some(_) => Err(err(
                &format!("{at}.{key}"),
                format!("{at}.{key}: a whole number of at least 1, or unlimited"),
            )),
        };
        let was = &inherited.limits;
        Ok(TenantPolicy {
            weight,
            class,
            allowed_classes,
            limits: Limits {
                input_tokens: limit(
                    &entry.input_tokens_per_minute,
                    "input_tokens_per_minute",
                    was.input_tokens,
                )?,
                output_tokens: limit(
                    &entry.output_tokens_per_minute,
                    "output_tokens_per_minute",
                    was.output_tokens,
                )?,
                cached_input_tokens: limit(
                    &entry.cached_input_tokens_per_minute,
                    "cached_input_tokens_per_minute",
                    was.cached_input_tokens,
                )?,
                requests: limit(
                    &entry.requests_per_minute,
                    "requests_per_minute",
                    was.requests,
                )?,
            },
            max_in_flight: limit(
                &entry.max_in_flight,
                "max_in_flight",
                inherited.max_in_flight,
            )?,
        })
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct TenantsFile {
    classes: Option<Vec<String>>,
    defaults: Option<PolicyFile>,
    /// A tenant written with no fields (`team-a:`) is on the defaults but
    /// named: it gets its own metric label.
    tenants: Option<BTreeMap<String, Option<PolicyFile>>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicyFile {
    weight: Option<f64>,
    class: Option<String>,
    allowed_classes: Option<Vec<String>>,
    input_tokens_per_minute: Option<LimitFile>,
    output_tokens_per_minute: Option<LimitFile>,
    cached_input_tokens_per_minute: Option<LimitFile>,
    requests_per_minute: Option<LimitFile>,
    max_in_flight: Option<LimitFile>,
}

/// A limit: a number, or `unlimited` (a named tenant lifting a default's).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum LimitFile {
    Number(u64),
    Word(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<TenantsConfig, ConfigError> {
        TenantsConfig::parse(Path::new("tenants.yaml"), text)
    }

    #[test]
    fn a_tenant_inherits_each_field_it_does_not_set_from_the_defaults() {
        let c = parse(
            "defaults:\n  input_tokens_per_minute: 1000\n  max_in_flight: 4\ntenants:\n  team-a:\n    weight: 3\n    class: interactive\n    max_in_flight: unlimited\n  team-b:\n",
        )
        .expect("valid");
        let a = c.policy("team-a");
        assert_eq!(a.weight, 3.0);
        assert_eq!(a.class, "interactive");
        assert_eq!(a.limits.input_tokens, Some(1000));
        assert_eq!(a.max_in_flight, None, "unlimited lifts the default");
        let b = c.policy("team-b");
        assert_eq!((b.weight, b.max_in_flight), (1.0, Some(4)));
        assert_eq!(b.class, "standard");
        assert!(c.names("team-b") && !c.names("team-c"));
        assert_eq!(c.policy("team-c"), &c.defaults);
        assert!(!c.is_unlimited());
        // Control: no file at all limits nothing.
        assert!(TenantsConfig::default().is_unlimited());
        assert!(parse("").expect("empty is valid").is_unlimited());
    }

    #[test]
    fn a_mistake_is_refused_at_its_line() {
        let cases = [
            (
                "tenants:\n  a:\n    class: urgent\n",
                3,
                "not one of the classes",
            ),
            ("tenants:\n  a:\n    weight: 0\n", 3, "weight"),
            ("defaults:\n  requests_per_minute: 0\n", 2, "at least 1"),
            (
                "tenants:\n  a:\n    allowed_classes: [batch]\n",
                2,
                "not among its allowed_classes",
            ),
            ("tenants:\n  other:\n    weight: 2\n", 2, "metric label"),
            ("tenants:\n  a:\n    wieght: 2\n", 3, "unknown field"),
        ];
        for (text, line, says) in cases {
            let e = parse(text).expect_err(text);
            assert_eq!(e.line, Some(line), "{text}: {e}");
            assert!(e.to_string().contains(says), "{text}: {e}");
        }
    }

    #[test]
    fn a_name_is_measured_in_characters_as_documented() {
        let longest = "é".repeat(MAX_TENANT_NAME);
        assert_eq!(name_problem(&longest), None, "128 characters, 256 bytes");
        // Control: one more is refused.
        assert!(name_problem(&format!("{longest}é")).is_some());
    }

    #[test]
    fn classes_may_be_renamed_and_the_default_class_follows() {
        let c = parse("classes: [gold, bronze]\n").expect("valid");
        assert_eq!(c.defaults.class, "bronze", "no standard: the lowest");
        assert_eq!(c.defaults.allowed_classes, ["gold", "bronze"]);
        let e = parse("classes: [gold, gold]\n").expect_err("twice");
        assert_eq!(e.line, Some(1));
    }
}
