//! Free loopback ports, so several sandboxes (tests, `make dev`) can run side by side.
//!
//! The ports are taken below the kernel's ephemeral range: a server restarted on the port it
//! had (a killed controller, a restarted Temporal) must find it free, and a port from the
//! ephemeral range can meanwhile become the source port of any outgoing connection (seen once:
//! a controller restarted during a chaos test could not bind its metrics port again).

use std::net::{Ipv4Addr, TcpListener};
use std::sync::atomic::{AtomicU32, Ordering};

/// Lowest port handed out.
const FLOOR: u16 = 10_000;
/// Where the ephemeral range starts when the kernel does not say.
const DEFAULT_EPHEMERAL_LOW: u16 = 32_768;

/// A free port on 127.0.0.1 below the ephemeral range. The port is released before returning;
/// a race with another process taking it is possible but rare, and shows up as a start failure.
pub fn free_port() -> std::io::Result<u16> {
    static CALLS: AtomicU32 = AtomicU32::new(0);
    let ceiling = ephemeral_low().unwrap_or(DEFAULT_EPHEMERAL_LOW);
    if ceiling <= FLOOR {
        return any_port();
    }
    let span = u32::from(ceiling - FLOOR);
    // Different processes and calls start at different places, so sandboxes started at the
    // same moment rarely try the same port first.
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let start = std::process::id()
        .wrapping_mul(7_919)
        .wrapping_add(nanos)
        .wrapping_add(CALLS.fetch_add(1, Ordering::Relaxed).wrapping_mul(104_729));
    for i in 0..span {
        let offset = start.wrapping_add(i) % span;
        let port = FLOOR + u16::try_from(offset).unwrap_or(0);
        if TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok() {
            return Ok(port);
        }
    }
    any_port()
}

/// Any free port the kernel picks (in the ephemeral range).
fn any_port() -> std::io::Result<u16> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
    Ok(listener.local_addr()?.port())
}

/// First port of the kernel's ephemeral range (Linux).
fn ephemeral_low() -> Option<u16> {
    let range = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok()?;
    range.split_whitespace().next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_ports_are_below_the_ephemeral_range_and_bindable() {
        let ceiling = ephemeral_low().unwrap_or(DEFAULT_EPHEMERAL_LOW);
        let ports: Vec<u16> = (0..20)
            .map(|_| free_port().unwrap_or_else(|e| panic!("free port: {e}")))
            .collect();
        for port in &ports {
            assert!(
                (FLOOR..ceiling).contains(port),
                "port {port} not in {FLOOR}..{ceiling}"
            );
            assert!(TcpListener::bind((Ipv4Addr::LOCALHOST, *port)).is_ok());
        }
    }
}
