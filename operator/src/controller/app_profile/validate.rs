//! AppProfile, stage 2 (pure): the Instance exists, and the profile's rules hold against its
//! clusters ([`crate::rules::validate_app_profile`]).

use super::dereference::Dereferenced;
use crate::crd::AppProfile;
use crate::rules::{self, Problem};

/// An AppProfile the Instance controller publishes.
#[derive(Debug, Clone)]
pub struct ValidatedAppProfile<'a> {
    pub profile: &'a AppProfile,
}

/// Why the profile is not published.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    /// `spec.instanceRef` names no Instance in the namespace.
    InstanceNotFound,
    /// The profile breaks a rule, or names clusters the instance does not have.
    InvalidSpec(Vec<Problem>),
}

pub fn validate<'a>(
    profile: &'a AppProfile,
    found: &Dereferenced,
) -> Result<ValidatedAppProfile<'a>, Refused> {
    if found.instance.is_none() {
        return Err(Refused::InstanceNotFound);
    }
    let problems = rules::validate_app_profile(profile, &found.clusters);
    if !problems.is_empty() {
        return Err(Refused::InvalidSpec(problems));
    }
    Ok(ValidatedAppProfile { profile })
}
