//! Who may have written an artifact. The checksum detects corruption, not tampering: anyone can
//! edit code bytes and recompute it. An artifact may carry an Ed25519 signature (a trailer after
//! the checksum: [`SIG_MAGIC`], the signer's public key, the signature of
//! [`SIGNED_CONTEXT`] ‖ checksum), and a [`TrustPolicy`] says whether one is required and from
//! whom. Both are checked in `Artifact::from_bytes_with`, before anything is decoded, so before
//! any code can be mapped.
//!
//! An unsigned artifact (allowed by [`TrustPolicy::AnyIntact`], the default) runs native code
//! from the file: trust it as you would trust an executable.
//!
//! Keys are files in the standard encodings (PKCS#8 PEM for the secret key, SPKI PEM for the
//! public key), so `openssl pkey -in k.key -pubout` agrees with `kiln keygen`. ed25519-dalek
//! does the cryptography and the encodings.

use std::path::Path;

use ed25519_dalek::pkcs8::{DecodePrivateKey, DecodePublicKey};
use ed25519_dalek::{Signature, Signer, SigningKey, Verifier, VerifyingKey};

use crate::error::{Error, Result};

/// The trailer's first bytes.
pub const SIG_MAGIC: &[u8; 8] = b"KILNSIG1";
/// Magic, public key, signature.
pub const SIG_BLOCK_LEN: usize = 8 + 32 + 64;
/// What a signature covers besides the checksum: a signature made for something else (another
/// protocol signing 32-byte digests with the same key) does not verify as an artifact's.
pub const SIGNED_CONTEXT: &[u8] = b"kiln artifact signature v1\0";

/// Which artifacts may be loaded.
#[derive(Debug, Clone, Default)]
pub enum TrustPolicy {
    /// Any intact artifact, signed or not (a signature present must still verify).
    #[default]
    AnyIntact,
    /// Only artifacts signed by one of these keys.
    SignedBy(Vec<VerifyingKey>),
}

impl TrustPolicy {
    /// Only artifacts signed by a key in one of these public-key files.
    pub fn from_key_files(paths: &[impl AsRef<Path>]) -> Result<Self> {
        Ok(TrustPolicy::SignedBy(paths.iter().map(|p| read_public_key(p.as_ref())).collect::<Result<_>>()?))
    }
}

/// A short name for a public key: the first 16 hex digits of its bytes.
pub fn key_id(key: &VerifyingKey) -> String {
    key.as_bytes()[..8].iter().map(|b| format!("{b:02x}")).collect()
}

fn message(checksum: &[u8]) -> Vec<u8> {
    [SIGNED_CONTEXT, checksum].concat()
}

/// The trailer that signs an artifact whose checksum is `checksum`.
pub fn signature_block(key: &SigningKey, checksum: &[u8; 32]) -> [u8; SIG_BLOCK_LEN] {
    let mut out = [0u8; SIG_BLOCK_LEN];
    out[..8].copy_from_slice(SIG_MAGIC);
    out[8..40].copy_from_slice(key.verifying_key().as_bytes());
    out[40..].copy_from_slice(&key.sign(&message(checksum)).to_bytes());
    out
}

/// Checks `trailer` (empty, or a signature block) over `checksum` against `policy`; returns the
/// signer. Errors are artifact errors.
pub(crate) fn check(trailer: &[u8], checksum: &[u8], policy: &TrustPolicy) -> Result<Option<VerifyingKey>> {
    let reject = |m: String| Err(Error::Artifact { message: m });
    let signer = match trailer.len() {
        0 => None,
        SIG_BLOCK_LEN if &trailer[..8] == SIG_MAGIC => {
            let key = VerifyingKey::from_bytes(trailer[8..40].try_into().unwrap())
                .map_err(|_| Error::Artifact { message: "the signature's public key is not a valid Ed25519 key".into() })?;
            let sig = Signature::from_bytes(trailer[40..].try_into().unwrap());
            if key.verify(&message(checksum), &sig).is_err() {
                return reject(format!("the signature (key {}) does not verify: the file was altered", key_id(&key)));
            }
            Some(key)
        }
        n => return reject(format!("{n} bytes after the checksum are not a signature block")),
    };
    match (policy, &signer) {
        (TrustPolicy::AnyIntact, _) => Ok(signer),
        (TrustPolicy::SignedBy(keys), Some(k)) if keys.contains(k) => Ok(signer),
        (TrustPolicy::SignedBy(keys), Some(k)) => reject(format!(
            "signed by key {}, which is not one of the {} trusted key(s)",
            key_id(k),
            keys.len()
        )),
        (TrustPolicy::SignedBy(_), None) => reject("unsigned, and only signed artifacts are trusted".into()),
    }
}

fn read_pem(path: &Path) -> Result<String> {
    let meta = std::fs::metadata(path).map_err(|e| Error::io(path, &e))?;
    // A PEM key is a few hundred bytes; do not read a device or a huge file to find that out.
    if !meta.is_file() || meta.len() > 64 << 10 {
        return Err(Error::Model { path: path.into(), message: "not a key file (a PEM file of a few hundred bytes)".into() });
    }
    std::fs::read_to_string(path).map_err(|e| Error::io(path, &e))
}

/// A public key from an SPKI PEM file (`kiln keygen`'s `.pub`, or `openssl pkey -pubout`).
pub fn read_public_key(path: &Path) -> Result<VerifyingKey> {
    VerifyingKey::from_public_key_pem(&read_pem(path)?)
        .map_err(|e| Error::Model { path: path.into(), message: format!("not an Ed25519 public key (SPKI PEM): {e}") })
}

/// A secret key from a PKCS#8 PEM file (`kiln keygen`'s `.key`, or `openssl genpkey -algorithm ed25519`).
pub fn read_signing_key(path: &Path) -> Result<SigningKey> {
    SigningKey::from_pkcs8_pem(&read_pem(path)?)
        .map_err(|e| Error::Model { path: path.into(), message: format!("not an Ed25519 secret key (PKCS#8 PEM): {e}") })
}
