//! Free loopback ports, so several sandboxes (tests, `make dev`) can run side by side.

use std::net::{Ipv4Addr, TcpListener};

/// Asks the OS for a free port on 127.0.0.1. The port is released before returning; a race with
/// another process taking it is possible but rare, and shows up as a start failure.
pub fn free_port() -> std::io::Result<u16> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
    Ok(listener.local_addr()?.port())
}
