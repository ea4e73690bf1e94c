//! Shape lists on the bench command line: `AxB` or `AxBxC`, every number at least 1.

use nsa_runtime::{Error, Result};

/// Parses `s` as N numbers joined by `x` (e.g. `128x1x16`). The error names the
/// flag, the value and the form `what` with an example.
pub fn parse_dims<const N: usize>(flag: &'static str, s: &str, what: &str, example: &str) -> Result<[usize; N]> {
    let bad = || Error::InvalidArgument {
        field: flag,
        value: format!("`{s}`"),
        expected: format!("{what}, each at least 1 (e.g. {example})"),
    };
    let parts: Vec<&str> = s.trim().split('x').collect();
    if parts.len() != N {
        return Err(bad());
    }
    let mut dims = [0usize; N];
    for (d, part) in dims.iter_mut().zip(&parts) {
        *d = part.trim().parse().map_err(|_| bad())?;
        if *d == 0 {
            return Err(bad());
        }
    }
    Ok(dims)
}

#[cfg(test)]
mod tests {
    use super::parse_dims;

    #[test]
    fn shapes_parse_and_bad_ones_name_the_flag() {
        assert_eq!(parse_dims::<3>("--f", "128x1x16", "b x s x h", "1x1x1").unwrap(), [128, 1, 16]);
        assert_eq!(parse_dims::<2>("--f", " 64x131072 ", "rows x keys", "1x2").unwrap(), [64, 131_072]);
        for bad in ["", "64", "64x", "x64", "64x0", "64x1x2", "64xabc", "-1x5"] {
            let err = parse_dims::<2>("--topk-shapes", bad, "rows x keys", "64x131072").unwrap_err().to_string();
            assert!(err.contains("--topk-shapes") && err.contains(&format!("`{bad}`")), "{bad}: {err}");
            assert!(err.contains("e.g. 64x131072"), "{err}");
        }
    }
}
