//! ECDSA P-256 key pairs in cosign's formats: the public key as a PEM `PUBLIC KEY`
//! (SubjectPublicKeyInfo), the private key as cosign's `ENCRYPTED SIGSTORE PRIVATE KEY`
//! (PKCS#8 sealed with NaCl secretbox under a scrypt-derived key; `cosign
//! generate-key-pair` writes the same, and each side reads the other's).

use base64::engine::general_purpose::STANDARD as B64;
use crypto_secretbox::XSalsa20Poly1305;
use crypto_secretbox::aead::{Aead, KeyInit};
use p256::ecdsa::signature::{Signer as _, Verifier as _};
use p256::ecdsa::{Signature, SigningKey, VerifyingKey};
use p256::pkcs8::der::pem::{self, LineEnding};
use p256::pkcs8::{DecodePrivateKey, DecodePublicKey, EncodePrivateKey, EncodePublicKey};
use rand_core::{OsRng, RngCore};
use serde::{Deserialize, Serialize};

use crate::error::Error;

/// The PEM label cosign writes its private keys under (older releases wrote
/// `ENCRYPTED COSIGN PRIVATE KEY`, read too).
pub const PRIVATE_KEY_LABEL: &str = "ENCRYPTED SIGSTORE PRIVATE KEY";
const LEGACY_LABEL: &str = "ENCRYPTED COSIGN PRIVATE KEY";

/// scrypt cost as cosign sets it: N = 2^16, r = 8, p = 1.
const SCRYPT_LOG_N: u8 = 16;

/// A signing key.
#[derive(Clone)]
pub struct KeyPair {
    key: SigningKey,
}

impl std::fmt::Debug for KeyPair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyPair")
            .field("public", &self.public())
            .finish_non_exhaustive()
    }
}

/// A verifying key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PublicKey {
    key: VerifyingKey,
}

#[derive(Serialize, Deserialize)]
struct Sealed {
    kdf: Kdf,
    cipher: Cipher,
    #[serde(with = "b64")]
    ciphertext: Vec<u8>,
}

#[derive(Serialize, Deserialize)]
struct Kdf {
    name: String,
    params: KdfParams,
    #[serde(with = "b64")]
    salt: Vec<u8>,
}

#[derive(Serialize, Deserialize)]
struct KdfParams {
    #[serde(rename = "N")]
    n: u64,
    r: u32,
    p: u32,
}

#[derive(Serialize, Deserialize)]
struct Cipher {
    name: String,
    #[serde(with = "b64")]
    nonce: Vec<u8>,
}

mod b64 {
    use base64::Engine as _;
    pub fn serialize<S: serde::Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&crate::keys::B64.encode(v))
    }
    pub fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let s: String = serde::Deserialize::deserialize(d)?;
        crate::keys::B64.decode(s).map_err(serde::de::Error::custom)
    }
}

fn derive(password: &[u8], salt: &[u8], log_n: u8, r: u32, p: u32) -> Result<[u8; 32], Error> {
    let params = scrypt::Params::new(log_n, r, p, 32)
        .map_err(|e| Error::Key(format!("scrypt parameters: {e}")))?;
    let mut key = [0u8; 32];
    scrypt::scrypt(password, salt, &params, &mut key)
        .map_err(|e| Error::Key(format!("scrypt: {e}")))?;
    Ok(key)
}

impl KeyPair {
    /// A fresh key pair from the operating system's randomness.
    pub fn generate() -> KeyPair {
        KeyPair {
            key: SigningKey::random(&mut OsRng),
        }
    }

    /// Its public half.
    pub fn public(&self) -> PublicKey {
        PublicKey {
            key: *self.key.verifying_key(),
        }
    }

    /// An ASN.1 DER ECDSA-SHA256 signature of `payload`, as cosign writes them.
    pub fn sign(&self, payload: &[u8]) -> Vec<u8> {
        let sig: Signature = self.key.sign(payload);
        sig.to_der().as_bytes().to_vec()
    }

    /// The private key sealed with `password`, as cosign's PEM.
    pub fn to_encrypted_pem(&self, password: &[u8]) -> Result<String, Error> {
        let der = self
            .key
            .to_pkcs8_der()
            .map_err(|e| Error::Key(format!("encoding the private key: {e}")))?;
        let mut salt = vec![0u8; 32];
        OsRng.fill_bytes(&mut salt);
        let mut nonce = vec![0u8; 24];
        OsRng.fill_bytes(&mut nonce);
        let key = derive(password, &salt, SCRYPT_LOG_N, 8, 1)?;
        let ciphertext = XSalsa20Poly1305::new(&key.into())
            .encrypt(nonce.as_slice().into(), der.as_bytes())
            .map_err(|_| Error::Key("sealing the private key failed".into()))?;
        let sealed = Sealed {
            kdf: Kdf {
                name: "scrypt".into(),
                params: KdfParams {
                    n: 1 << SCRYPT_LOG_N,
                    r: 8,
                    p: 1,
                },
                salt,
            },
            cipher: Cipher {
                name: "nacl/secretbox".into(),
                nonce,
            },
            ciphertext,
        };
        let json = serde_json::to_vec(&sealed).expect("JSON");
        pem::encode_string(PRIVATE_KEY_LABEL, LineEnding::LF, &json)
            .map_err(|e| Error::Key(format!("PEM: {e}")))
    }

    /// Opens cosign's encrypted private key PEM with `password`.
    pub fn from_encrypted_pem(text: &str, password: &[u8]) -> Result<KeyPair, Error> {
        let (label, json) = pem::decode_vec(text.trim().as_bytes())
            .map_err(|e| Error::Key(format!("not a PEM private key: {e}")))?;
        if label != PRIVATE_KEY_LABEL && label != LEGACY_LABEL {
            return Err(Error::Key(format!(
                "a PEM {label:?}, not an encrypted cosign private key ({PRIVATE_KEY_LABEL})"
            )));
        }
        let sealed: Sealed = serde_json::from_slice(&json)
            .map_err(|e| Error::Key(format!("the sealed key: {e}")))?;
        if sealed.kdf.name != "scrypt" || sealed.cipher.name != "nacl/secretbox" {
            return Err(Error::Key(format!(
                "unsupported key sealing {} + {}",
                sealed.kdf.name, sealed.cipher.name
            )));
        }
        let n = sealed.kdf.params.n;
        if !n.is_power_of_two() || n < 2 {
            return Err(Error::Key(format!("scrypt N {n} is not a power of two")));
        }
        let key = derive(
            password,
            &sealed.kdf.salt,
            n.trailing_zeros() as u8,
            sealed.kdf.params.r,
            sealed.kdf.params.p,
        )?;
        if sealed.cipher.nonce.len() != 24 {
            return Err(Error::Key("the secretbox nonce is not 24 bytes".into()));
        }
        let der = XSalsa20Poly1305::new(&key.into())
            .decrypt(
                sealed.cipher.nonce.as_slice().into(),
                sealed.ciphertext.as_slice(),
            )
            .map_err(|_| Error::Key("wrong password (or a damaged key)".into()))?;
        let key = SigningKey::from_pkcs8_der(&der)
            .map_err(|e| Error::Key(format!("not an ECDSA P-256 key: {e}")))?;
        Ok(KeyPair { key })
    }
}

impl PublicKey {
    /// Reads a PEM `PUBLIC KEY` (what `cosign generate-key-pair` writes as `cosign.pub`).
    pub fn from_pem(text: &str) -> Result<PublicKey, Error> {
        let key = VerifyingKey::from_public_key_pem(text.trim())
            .map_err(|e| Error::Key(format!("not an ECDSA P-256 public key PEM: {e}")))?;
        Ok(PublicKey { key })
    }

    /// As a PEM `PUBLIC KEY`.
    pub fn to_pem(&self) -> String {
        self.key
            .to_public_key_pem(LineEnding::LF)
            .expect("a P-256 key encodes")
    }

    /// Whether `signature` (ASN.1 DER, or the raw 64-byte form) signs `payload`.
    pub fn verifies(&self, payload: &[u8], signature: &[u8]) -> bool {
        let sig = Signature::from_der(signature).or_else(|_| Signature::from_slice(signature));
        sig.is_ok_and(|s| self.key.verify(payload, &s).is_ok())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip_and_sign() {
        let pair = KeyPair::generate();
        let pem = pair.to_encrypted_pem(b"secret").unwrap();
        assert!(
            pem.starts_with("-----BEGIN ENCRYPTED SIGSTORE PRIVATE KEY-----"),
            "{pem}"
        );
        let back = KeyPair::from_encrypted_pem(&pem, b"secret").unwrap();
        assert_eq!(back.public(), pair.public());
        assert!(
            KeyPair::from_encrypted_pem(&pem, b"wrong")
                .unwrap_err()
                .to_string()
                .contains("wrong password")
        );
        let public = PublicKey::from_pem(&pair.public().to_pem()).unwrap();
        let sig = back.sign(b"payload");
        assert!(public.verifies(b"payload", &sig));
        assert!(!public.verifies(b"other payload", &sig));
        assert!(!KeyPair::generate().public().verifies(b"payload", &sig));
    }
}
