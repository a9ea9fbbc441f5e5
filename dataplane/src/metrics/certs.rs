//! When a certificate expires: the `notAfter` of the first certificate of a PEM chain, read with a
//! minimal DER walk (Certificate → tbsCertificate → validity).

use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;

/// Why an expiry cannot be read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ExpiryError {
    /// No certificate in the PEM text.
    #[error("no certificate in the PEM text")]
    NoCertificate,
    /// The DER does not have the shape of an X.509 certificate.
    #[error("malformed certificate: {0}")]
    Malformed(&'static str),
}

/// The `notAfter` of the first certificate in `chain_pem`, in seconds since the Unix epoch.
pub fn not_after(chain_pem: &str) -> Result<i64, ExpiryError> {
    let der = CertificateDer::pem_slice_iter(chain_pem.as_bytes())
        .next()
        .ok_or(ExpiryError::NoCertificate)?
        .map_err(|_| ExpiryError::NoCertificate)?;
    not_after_der(&der)
}

/// The `notAfter` of a DER certificate, in seconds since the Unix epoch.
pub fn not_after_der(der: &[u8]) -> Result<i64, ExpiryError> {
    let (cert, _) = tlv(der, 0x30).ok_or(ExpiryError::Malformed("certificate"))?;
    let (tbs, _) = tlv(cert, 0x30).ok_or(ExpiryError::Malformed("tbsCertificate"))?;
    let mut rest = tbs;
    if rest.first() == Some(&0xA0) {
        rest = tlv(rest, 0xA0).ok_or(ExpiryError::Malformed("version"))?.1;
    }
    rest = tlv(rest, 0x02).ok_or(ExpiryError::Malformed("serialNumber"))?.1;
    rest = tlv(rest, 0x30).ok_or(ExpiryError::Malformed("signature"))?.1;
    rest = tlv(rest, 0x30).ok_or(ExpiryError::Malformed("issuer"))?.1;
    let (validity, _) = tlv(rest, 0x30).ok_or(ExpiryError::Malformed("validity"))?;
    let tag_before = *validity.first().ok_or(ExpiryError::Malformed("notBefore"))?;
    let (_, after) = tlv(validity, tag_before).ok_or(ExpiryError::Malformed("notBefore"))?;
    let tag = *after.first().ok_or(ExpiryError::Malformed("notAfter"))?;
    let (time, _) = tlv(after, tag).ok_or(ExpiryError::Malformed("notAfter"))?;
    parse_time(tag, time).ok_or(ExpiryError::Malformed("notAfter time"))
}

/// Splits one DER element of tag `tag` off `input`: (its content, what follows).
fn tlv(input: &[u8], tag: u8) -> Option<(&[u8], &[u8])> {
    let (&t, rest) = input.split_first()?;
    if t != tag {
        return None;
    }
    let (&first, mut rest) = rest.split_first()?;
    let len = if first < 0x80 {
        usize::from(first)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let len = rest[..n].iter().fold(0usize, |acc, &b| (acc << 8) | usize::from(b));
        rest = &rest[n..];
        len
    };
    (rest.len() >= len).then(|| rest.split_at(len))
}

/// UTCTime (`YYMMDDHHMMSSZ`, tag 0x17) or GeneralizedTime (`YYYYMMDDHHMMSSZ`, tag 0x18).
fn parse_time(tag: u8, text: &[u8]) -> Option<i64> {
    let digits = |s: &[u8]| -> Option<i64> {
        s.iter().try_fold(0i64, |acc, &b| b.is_ascii_digit().then(|| acc * 10 + i64::from(b - b'0')))
    };
    let (year, rest) = match tag {
        0x17 if text.len() == 13 => {
            let yy = digits(&text[..2])?;
            (if yy >= 50 { 1900 + yy } else { 2000 + yy }, &text[2..])
        }
        0x18 if text.len() == 15 => (digits(&text[..4])?, &text[4..]),
        _ => return None,
    };
    if rest.last() != Some(&b'Z') {
        return None;
    }
    let (month, day) = (digits(&rest[0..2])?, digits(&rest[2..4])?);
    let (hour, minute, second) = (digits(&rest[4..6])?, digits(&rest[6..8])?, digits(&rest[8..10])?);
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || hour > 23 || minute > 59 || second > 60 {
        return None;
    }
    Some(days_from_civil(year, month, day) * 86_400 + hour * 3600 + minute * 60 + second)
}

/// Days from 1970-01-01 to a proleptic Gregorian date.
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    /// rcgen's certificate with a chosen `notAfter` reads back to the same second.
    #[test]
    fn reads_not_after_of_a_generated_certificate() {
        let mut params = rcgen::CertificateParams::new(vec!["a.example.com".to_string()]).expect("params");
        params.not_after = rcgen::date_time_ymd(2031, 7, 9);
        let key = rcgen::KeyPair::generate().expect("key");
        let cert = params.self_signed(&key).expect("cert");
        // 2031-07-09T00:00:00Z
        assert_eq!(not_after(&cert.pem()), Ok(1_941_321_600));
    }

    #[test]
    fn civil_dates() {
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
        assert_eq!(parse_time(0x17, b"491231235959Z"), Some(2_524_607_999));
        assert_eq!(parse_time(0x18, b"20500101000000Z"), Some(2_524_608_000));
    }

    /// Garbage is an error, never a panic.
    #[test]
    fn malformed_input_is_an_error() {
        assert_eq!(not_after("not pem"), Err(ExpiryError::NoCertificate));
        for der in [&[][..], &[0x30], &[0x30, 0x84, 0xff, 0xff, 0xff, 0xff], &[0x30, 0x03, 0x30, 0x01, 0x02]]
        {
            assert!(not_after_der(der).is_err(), "{der:?}");
        }
    }
}
