//! Certificates for the TLS tests, made with the `openssl` command: a
//! self-signed CA and a server certificate it signs.

use std::path::{Path, PathBuf};
use std::process::Command;

/// A CA and a server certificate and key it signed, in a directory of
/// their own.
#[derive(Debug)]
pub struct TestCa {
    dir: tempfile::TempDir,
}

impl TestCa {
    /// A fresh CA named `name` with a server certificate for `hosts` (DNS
    /// names, or IP addresses written as such), valid for two days.
    pub fn new(name: &str, hosts: &[&str]) -> TestCa {
        let dir = tempfile::tempdir().expect("a directory for the certificates");
        let path = |file: &str| dir.path().join(file).display().to_string();
        openssl(&[
            "req",
            "-x509",
            "-new",
            "-nodes",
            "-days",
            "2",
            "-newkey",
            "rsa:2048",
            "-subj",
            &format!("/CN={name}"),
            "-keyout",
            &path("ca.key"),
            "-out",
            &path("ca.crt"),
        ]);
        openssl(&[
            "req",
            "-new",
            "-nodes",
            "-newkey",
            "rsa:2048",
            "-subj",
            "/CN=keiro-test-server",
            "-keyout",
            &path("server.key"),
            "-out",
            &path("server.csr"),
        ]);
        let names: Vec<String> = hosts
            .iter()
            .map(|host| match host.parse::<std::net::IpAddr>() {
                Ok(_) => format!("IP:{host}"),
                Err(_) => format!("DNS:{host}"),
            })
            .collect();
        std::fs::write(
            dir.path().join("server.ext"),
            format!(
                "subjectAltName={}\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n",
                names.join(",")
            ),
        )
        .expect("write the certificate extensions");
        openssl(&[
            "x509",
            "-req",
            "-days",
            "2",
            "-in",
            &path("server.csr"),
            "-CA",
            &path("ca.crt"),
            "-CAkey",
            &path("ca.key"),
            "-CAcreateserial",
            "-extfile",
            &path("server.ext"),
            "-out",
            &path("server.crt"),
        ]);
        TestCa { dir }
    }

    /// The CA's certificate (what a client trusts: `sslrootcert`).
    pub fn root(&self) -> PathBuf {
        self.dir.path().join("ca.crt")
    }

    /// The server's certificate.
    pub fn server_cert(&self) -> PathBuf {
        self.dir.path().join("server.crt")
    }

    /// The server's private key.
    pub fn server_key(&self) -> PathBuf {
        self.dir.path().join("server.key")
    }

    /// The directory holding them.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

fn openssl(args: &[&str]) {
    let output = Command::new("openssl")
        .args(args)
        .output()
        .expect("run openssl (Debian's `openssl` package)");
    assert!(
        output.status.success(),
        "openssl {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}
