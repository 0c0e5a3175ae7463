//! Records the version of the `talaris` crate this client is built against
//! (read from Cargo.lock, the resolved version, not the requirement), so the
//! binary can print which anchor version produced its numbers.

use std::fs;

fn main() {
    println!("cargo:rerun-if-changed=Cargo.lock");
    let lock = fs::read_to_string("Cargo.lock").unwrap_or_default();
    let mut version = String::from("unknown");
    let mut in_talaris = false;
    for line in lock.lines() {
        let line = line.trim();
        if line == "[[package]]" {
            in_talaris = false;
        } else if line == "name = \"talaris\"" {
            in_talaris = true;
        } else if in_talaris {
            if let Some(v) = line.strip_prefix("version = \"").and_then(|v| v.strip_suffix('"')) {
                version = v.to_owned();
                break;
            }
        }
    }
    println!("cargo:rustc-env=TALARIS_CRATE_VERSION={version}");
}
