//! The local sandbox: starts real servers (Temporal dev server, kube-apiserver) on loopback and
//! plays the parts of a cluster that do not exist here (the pod runner). Used by `make dev` and
//! by the end-to-end tests; never by the controller itself.

pub mod apiserver;
pub mod browser;
pub mod env;
pub mod http;
pub mod load;
pub mod podrunner;
pub mod ports;
pub mod process;
pub mod production;
pub mod prometheus;
pub mod temporal;
pub mod tracing_backend;
pub mod up;
pub mod wait;
pub mod webhook;
