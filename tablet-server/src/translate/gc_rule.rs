//! GC rules of the table admin API (`google.bigtable.admin.v2.GcRule`) to and from Basalt's
//! [`GcRule`], with Bigtable's checks (positive ages of at least 1 ms, at least one version,
//! no empty sub-rules, nesting at most [`MAX_GC_RULE_DEPTH`] deep).

use basalt_model::gc::{GcRule, MAX_GC_RULE_DEPTH};

use crate::error::{Error, Result};
use googleapis_tonic_google_bigtable_admin_v2::google::bigtable::admin::v2 as admin;

/// Converts and validates a rule from the admin API. An empty rule (`rule: None`) means
/// "never collect" and is returned as `None`.
pub fn gc_rule_from_proto(rule: &admin::GcRule) -> Result<Option<GcRule>> {
    from_proto_at(rule, 0)
}

fn from_proto_at(rule: &admin::GcRule, depth: usize) -> Result<Option<GcRule>> {
    use admin::gc_rule::Rule;
    if depth > MAX_GC_RULE_DEPTH {
        return Err(Error::InvalidArgument(format!(
            "GC rule is nested deeper than {MAX_GC_RULE_DEPTH} levels"
        )));
    }
    let Some(r) = &rule.rule else {
        return Ok(None);
    };
    Ok(Some(match r {
        Rule::MaxNumVersions(n) => {
            if *n < 1 {
                return Err(Error::InvalidArgument(format!(
                    "GC rule max_num_versions must be at least 1, got {n}"
                )));
            }
            GcRule::MaxNumVersions(*n as u32)
        }
        Rule::MaxAge(d) => {
            let micros = d
                .seconds
                .checked_mul(1_000_000)
                .and_then(|s| s.checked_add(i64::from(d.nanos) / 1000));
            match micros {
                // Bigtable requires a positive age of at least one millisecond.
                Some(m) if m >= 1000 && d.nanos >= 0 => GcRule::MaxAgeMicros(m),
                _ => {
                    return Err(Error::InvalidArgument(format!(
                        "GC rule max_age must be at least 1ms, got {}s {}ns",
                        d.seconds, d.nanos
                    )));
                }
            }
        }
        Rule::Intersection(i) => GcRule::Intersection(children(&i.rules, depth)?),
        Rule::Union(u) => GcRule::Union(children(&u.rules, depth)?),
    }))
}

fn children(rules: &[admin::GcRule], depth: usize) -> Result<Vec<GcRule>> {
    let mut out = Vec::with_capacity(rules.len());
    for r in rules {
        match from_proto_at(r, depth + 1)? {
            Some(rule) => out.push(rule),
            None => {
                return Err(Error::InvalidArgument(
                    "GC rule union/intersection contains an empty rule".into(),
                ));
            }
        }
    }
    Ok(out)
}

pub fn gc_rule_to_proto(rule: &GcRule) -> admin::GcRule {
    use admin::gc_rule::{Intersection, Rule, Union};
    let rule = match rule {
        GcRule::MaxNumVersions(n) => Rule::MaxNumVersions(*n as i32),
        GcRule::MaxAgeMicros(m) => Rule::MaxAge(prost_types::Duration {
            seconds: m / 1_000_000,
            nanos: ((m % 1_000_000) * 1000) as i32,
        }),
        GcRule::Intersection(rs) => Rule::Intersection(Intersection {
            rules: rs.iter().map(gc_rule_to_proto).collect(),
        }),
        GcRule::Union(rs) => Rule::Union(Union {
            rules: rs.iter().map(gc_rule_to_proto).collect(),
        }),
    };
    admin::GcRule { rule: Some(rule) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use admin::gc_rule::{Intersection, Rule, Union};

    fn age(secs: i64) -> admin::GcRule {
        admin::GcRule {
            rule: Some(Rule::MaxAge(prost_types::Duration {
                seconds: secs,
                nanos: 0,
            })),
        }
    }
    fn versions(n: i32) -> admin::GcRule {
        admin::GcRule {
            rule: Some(Rule::MaxNumVersions(n)),
        }
    }
    const NOW: i64 = 1_000_000_000_000;

    #[test]
    fn max_versions_keeps_newest() {
        let r = gc_rule_from_proto(&versions(2)).unwrap().unwrap();
        assert_eq!(r.eligible(Some(0), 0, NOW), Some(false));
        assert_eq!(r.eligible(Some(1), 0, NOW), Some(false));
        assert_eq!(r.eligible(Some(2), 0, NOW), Some(true));
        assert_eq!(r.eligible(None, 0, NOW), None);
    }

    #[test]
    fn max_age_and_cell_level_ttl() {
        let r = gc_rule_from_proto(&age(1)).unwrap().unwrap();
        // Timestamp = expiry time: visible until one second after it.
        let expiry = NOW;
        assert_eq!(r.eligible(None, expiry, NOW + 999_999), Some(false));
        assert_eq!(r.eligible(None, expiry, NOW + 1_000_000), Some(false));
        assert_eq!(r.eligible(None, expiry, NOW + 1_000_001), Some(true));
        assert_eq!(r.eligible(None, NOW + 60_000_000, NOW), Some(false));
    }

    #[test]
    fn union_and_intersection_nested() {
        let union = admin::GcRule {
            rule: Some(Rule::Union(Union {
                rules: vec![versions(1), age(10)],
            })),
        };
        let r = gc_rule_from_proto(&union).unwrap().unwrap();
        assert_eq!(r.eligible(Some(1), NOW, NOW), Some(true));
        assert_eq!(r.eligible(Some(0), NOW - 11_000_000, NOW), Some(true));
        assert_eq!(r.eligible(Some(0), NOW, NOW), Some(false));
        // Without the index the compaction filter can still drop old cells.
        assert_eq!(r.eligible(None, NOW - 11_000_000, NOW), Some(true));
        assert_eq!(r.eligible(None, NOW, NOW), None);

        let inter = admin::GcRule {
            rule: Some(Rule::Intersection(Intersection {
                rules: vec![versions(1), age(10)],
            })),
        };
        let r = gc_rule_from_proto(&inter).unwrap().unwrap();
        assert_eq!(r.eligible(Some(1), NOW - 11_000_000, NOW), Some(true));
        assert_eq!(r.eligible(Some(1), NOW, NOW), Some(false));
        assert_eq!(r.eligible(Some(0), NOW - 11_000_000, NOW), Some(false));
        assert_eq!(r.eligible(None, NOW - 11_000_000, NOW), None);
        assert_eq!(r.eligible(None, NOW, NOW), Some(false));

        let nested = admin::GcRule {
            rule: Some(Rule::Union(Union {
                rules: vec![inter.clone(), versions(3)],
            })),
        };
        let r = gc_rule_from_proto(&nested).unwrap().unwrap();
        assert_eq!(r.eligible(Some(3), NOW, NOW), Some(true));
        assert_eq!(r.eligible(Some(2), NOW, NOW), Some(false));
        assert_eq!(r.eligible(Some(1), NOW - 11_000_000, NOW), Some(true));
        assert!(r.counts_versions());
        assert_eq!(
            gc_rule_from_proto(&gc_rule_to_proto(&r)).unwrap().unwrap(),
            r
        );
    }

    #[test]
    fn invalid_rules_are_rejected() {
        assert!(gc_rule_from_proto(&versions(0)).is_err());
        assert!(gc_rule_from_proto(&age(0)).is_err());
        assert!(gc_rule_from_proto(&age(-5)).is_err());
        let with_empty = admin::GcRule {
            rule: Some(Rule::Union(Union {
                rules: vec![admin::GcRule { rule: None }],
            })),
        };
        assert!(gc_rule_from_proto(&with_empty).is_err());
        assert_eq!(
            gc_rule_from_proto(&admin::GcRule { rule: None }).unwrap(),
            None
        );
    }
}
