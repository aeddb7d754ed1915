//! WorkerResourceTemplates (reference §1.3, §3.17, §5.2), on the Kubernetes side of `twc run`
//! only (the Temporal workflows know nothing of them): the controller that keeps one copy of
//! each template per live version of its worker deployment ([`controller`], deciding with
//! [`plan`]), and the validating webhook that admits templates ([`admission`], served by
//! [`webhook`]).

pub mod admission;
pub mod controller;
pub mod kinds;
pub mod plan;
pub mod webhook;
