//! Pure decisions: given what was observed, the spec and the workflow's own memory, what should
//! happen next. No I/O, no clocks (`now` is passed in), no randomness; table-tested.

pub mod analysis;
pub mod autoscale;
pub mod conditions;
pub mod deletion;
pub mod drain;
pub mod notify;
pub mod rollout;
pub mod spec_view;
pub mod status;
pub mod sunset;
pub mod twd;

#[cfg(test)]
pub(crate) mod fixtures;
