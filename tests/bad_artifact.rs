//! Files that are not artifacts, given to `kiln inspect` and `kiln embed --plan`: refused with
//! a one-line error naming the file, without reading more than their head, and without blocking
//! on a FIFO or a device.

use std::process::Command;
use std::time::{Duration, Instant};

fn kiln(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_kiln")).args(args).output().expect("kiln runs");
    (out.status.success(), String::from_utf8_lossy(&out.stderr).into())
}

fn refused(path: &str, needle: &str) {
    let t = Instant::now();
    let (ok, err) = kiln(&["inspect", path]);
    assert!(!ok && err.trim().lines().count() == 1 && err.contains(path) && err.contains(needle), "{path}: {err}");
    assert!(t.elapsed() < Duration::from_secs(20), "{path}: took {:?}", t.elapsed());
}

#[test]
fn devices_fifos_and_folders_are_not_read() {
    refused("/dev/zero", "not a regular file");
    let tmp = tempfile::tempdir().unwrap();
    let fifo = tmp.path().join("plan.fifo");
    assert!(Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    refused(fifo.to_str().unwrap(), "not a regular file");
    refused(tmp.path().to_str().unwrap(), "not a regular file");
}

#[test]
fn lengths_are_checked_against_the_file_size_before_reading() {
    let tmp = tempfile::tempdir().unwrap();
    let write = |name: &str, bytes: &[u8]| {
        let p = tmp.path().join(name);
        std::fs::write(&p, bytes).unwrap();
        p.to_str().unwrap().to_string()
    };
    let mut head = b"KILNPLAN".to_vec();
    head.extend_from_slice(&1u32.to_le_bytes());
    // A header of 4 GiB - 1 in a 100-byte file.
    let mut big_header = head.clone();
    big_header.extend_from_slice(&u32::MAX.to_le_bytes());
    big_header.resize(100, 0);
    refused(&write("header.kiln", &big_header), "header length 4294967295 runs past the end of the 100-byte file");
    // A body of 2^63 bytes.
    let mut big_body = head.clone();
    big_body.extend_from_slice(&0u32.to_le_bytes());
    big_body.extend_from_slice(&(1u64 << 63).to_le_bytes());
    big_body.resize(100, 0);
    refused(&write("body.kiln", &big_body), "body length 9223372036854775808 does not match the 100-byte file");
    // A 64 MiB sparse file with a plausible head: the lengths fail before the rest is read.
    let sparse = tmp.path().join("sparse.kiln");
    let f = std::fs::File::create(&sparse).unwrap();
    f.set_len(64 << 20).unwrap();
    drop(f);
    refused(sparse.to_str().unwrap(), "bad magic");
}

/// Random bytes after a valid magic are corruption, not "another kiln build".
#[test]
fn random_bytes_after_the_magic_are_corruption() {
    let tmp = tempfile::tempdir().unwrap();
    let mut bytes = b"KILNPLAN".to_vec();
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    for _ in 0..4096 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        bytes.push(x as u8);
    }
    // Lengths that fit the file, so the checksum and version are what decide.
    bytes[12..16].copy_from_slice(&16u32.to_le_bytes());
    let body_len = (bytes.len() - 16 - 16 - 8 - 32) as u64;
    bytes[32..40].copy_from_slice(&body_len.to_le_bytes());
    let p = tmp.path().join("random.kiln");
    std::fs::write(&p, &bytes).unwrap();
    let (ok, err) = kiln(&["inspect", p.to_str().unwrap()]);
    assert!(!ok && err.contains("corrupt") && !err.contains("another kiln build"), "{err}");
}
