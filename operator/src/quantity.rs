//! Kubernetes resource quantities (`10Gi`, `500M`, `1073741824`).

/// Parses a Kubernetes quantity (`10Gi`, `500M`, `1T`, `1073741824`) into bytes.
/// A CPU quantity (`500m`, `2`, `0.5`) in millicores; None if it is not one.
pub fn parse_cpu_millicores(q: &str) -> Option<u64> {
    let q = q.trim();
    let (number, scale) = match q.strip_suffix('m') {
        Some(n) => (n, 1.0),
        None => (q, 1000.0),
    };
    let v: f64 = number.parse().ok()?;
    (v.is_finite() && v > 0.0).then(|| (v * scale).round().max(1.0) as u64)
}

pub fn parse_quantity_bytes(q: &str) -> Option<u64> {
    let split = q
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(q.len());
    let (num, suffix) = q.split_at(split);
    let value: f64 = num.parse().ok()?;
    let mult: f64 = match suffix {
        "" => 1.0,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "Ki" => 1024.0,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        _ => return None,
    };
    let bytes = value * mult;
    (bytes.is_finite() && bytes >= 1.0).then_some(bytes as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_quantities_in_millicores() {
        assert_eq!(parse_cpu_millicores("250m"), Some(250));
        assert_eq!(parse_cpu_millicores("2"), Some(2000));
        assert_eq!(parse_cpu_millicores("0.5"), Some(500));
        assert_eq!(parse_cpu_millicores("lots"), None);
        assert_eq!(parse_cpu_millicores("0"), None);
    }

    #[test]
    fn quantities() {
        assert_eq!(parse_quantity_bytes("10Gi"), Some(10 << 30));
        assert_eq!(parse_quantity_bytes("500M"), Some(500_000_000));
        assert_eq!(parse_quantity_bytes("1.5Ti"), Some(3 << 39));
        assert_eq!(parse_quantity_bytes("1073741824"), Some(1 << 30));
        assert_eq!(parse_quantity_bytes("lots"), None);
        assert_eq!(parse_quantity_bytes("10GB"), None);
        assert_eq!(parse_quantity_bytes("0"), None);
    }
}
