//! Certificates made at test time (rcgen): a certificate authority per
//! test, and the server or client certificates it signs.

/// A certificate authority made for one test, its certificate in `pem`.
pub struct TestCa {
    pub pem: String,
    pub issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
}

pub fn new_ca(name: &str) -> TestCa {
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, name);
    params.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::DigitalSignature,
        rcgen::KeyUsagePurpose::CrlSign,
    ];
    let key = rcgen::KeyPair::generate().expect("CA key");
    let cert = params.self_signed(&key).expect("CA certificate");
    TestCa {
        pem: cert.pem(),
        issuer: rcgen::Issuer::new(params, key),
    }
}

/// A certificate for `name` (a DNS name or an IP address) signed by `ca`,
/// for a server or a client as `usage` says, and its key.
pub fn leaf(
    ca: &TestCa,
    name: &str,
    usage: rcgen::ExtendedKeyUsagePurpose,
) -> (rcgen::Certificate, rcgen::KeyPair) {
    let mut params = rcgen::CertificateParams::new(vec![name.to_string()]).expect("parameters");
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, name);
    params.use_authority_key_identifier_extension = true;
    params.key_usages = vec![rcgen::KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![usage];
    let key = rcgen::KeyPair::generate().expect("key");
    let cert = params.signed_by(&key, &ca.issuer).expect("certificate");
    (cert, key)
}
