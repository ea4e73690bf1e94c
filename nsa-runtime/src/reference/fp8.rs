//! OCP e4m3fn ("float8_e4m3fn") conversions, bit-exact with PTX
//! `cvt.rn.satfinite.e4m3x2.f32` and `cvt.rn.f16x2.e4m3x2`.

/// Largest finite e4m3fn magnitude.
pub const E4M3_MAX: f32 = 448.0;

/// Decodes one e4m3fn byte (exact). 0x7f/0xff are NaN; there are no infinities.
pub fn e4m3_to_f32(v: u8) -> f32 {
    let sign = if v & 0x80 != 0 { -1.0f32 } else { 1.0 };
    let exp = (v >> 3) & 0xf;
    let man = (v & 7) as f32;
    if exp == 0xf && v & 7 == 7 {
        return f32::NAN;
    }
    if exp == 0 {
        sign * man * 2f32.powi(-9)
    } else {
        sign * (1.0 + man / 8.0) * 2f32.powi(exp as i32 - 7)
    }
}

/// f32 → e4m3fn with round-to-nearest-even and saturation: |x| ≥ 448 (and ±inf)
/// become ±448, NaN becomes 0x7f with the input's sign.
pub fn f32_to_e4m3_satfinite(x: f32) -> u8 {
    let bits = x.to_bits();
    let sign = ((bits >> 24) & 0x80) as u8;
    let mag = bits & 0x7fff_ffff;
    if mag > 0x7f80_0000 {
        return sign | 0x7f;
    }
    if mag >= 0x43e0_0000 {
        return sign | 0x7e;
    }
    let exp = (mag >> 23) as i32 - 127;
    if exp >= -6 {
        let t = mag - (120 << 23);
        let t = (t + 0x7ffff + ((t >> 20) & 1)) >> 20;
        return sign | t as u8;
    }
    if exp == -127 {
        return sign;
    }
    let mant = (mag & 0x7f_ffff) | 0x80_0000;
    let shift = (14 - exp) as u32;
    if shift >= 32 {
        return sign;
    }
    let rem = mant & ((1 << shift) - 1);
    let half = 1 << (shift - 1);
    let mut m = mant >> shift;
    if rem > half || (rem == half && m & 1 == 1) {
        m += 1;
    }
    sign | m as u8
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The nearest finite e4m3 value by brute force over all 254 finite codes,
    /// ties to the even code, after saturating to ±448.
    fn brute(x: f32) -> u8 {
        let x = x.clamp(-E4M3_MAX, E4M3_MAX);
        let mut best: Option<(f64, u8)> = None;
        for code in 0u8..=255 {
            let v = e4m3_to_f32(code);
            if v.is_nan() || (v == 0.0 && v.is_sign_negative() != x.is_sign_negative()) {
                continue;
            }
            let d = (v as f64 - x as f64).abs();
            best = match best {
                Some((bd, bc)) if bd < d || (bd == d && bc & 1 == 0) => Some((bd, bc)),
                _ => Some((d, code)),
            };
        }
        best.unwrap().1
    }

    #[test]
    fn decode_table_matches_format() {
        assert_eq!(e4m3_to_f32(0x7e), 448.0);
        assert_eq!(e4m3_to_f32(0xfe), -448.0);
        assert_eq!(e4m3_to_f32(0x01), 2f32.powi(-9));
        assert_eq!(e4m3_to_f32(0x08), 2f32.powi(-6));
        assert_eq!(e4m3_to_f32(0x72), 160.0);
        assert!(e4m3_to_f32(0x7f).is_nan() && e4m3_to_f32(0xff).is_nan());
    }

    #[test]
    fn every_code_round_trips() {
        for code in 0u8..=255 {
            let v = e4m3_to_f32(code);
            if !v.is_nan() {
                assert_eq!(f32_to_e4m3_satfinite(v), code, "code {code:#x} = {v}");
            }
        }
    }

    #[test]
    fn matches_brute_force_nearest_even() {
        // Every midpoint and its neighbours, plus a dense sweep.
        let mut xs = Vec::new();
        for code in 0u8..0x7e {
            let (a, b) = (e4m3_to_f32(code), e4m3_to_f32(code + 1));
            let mid = (a + b) / 2.0;
            xs.extend([mid, f32::from_bits(mid.to_bits() + 1), f32::from_bits(mid.to_bits() - 1)]);
        }
        let mut x = 1e-5f32;
        while x < 600.0 {
            xs.push(x);
            x *= 1.0007;
        }
        for x in xs {
            for v in [x, -x] {
                assert_eq!(f32_to_e4m3_satfinite(v), brute(v), "x = {v:e}");
            }
        }
    }

    #[test]
    fn specials() {
        assert_eq!(f32_to_e4m3_satfinite(f32::INFINITY), 0x7e);
        assert_eq!(f32_to_e4m3_satfinite(f32::NEG_INFINITY), 0xfe);
        assert_eq!(f32_to_e4m3_satfinite(f32::NAN) & 0x7f, 0x7f);
        assert_eq!(f32_to_e4m3_satfinite(1e30), 0x7e);
        assert_eq!(f32_to_e4m3_satfinite(464.0), 0x7e);
        assert_eq!(f32_to_e4m3_satfinite(-0.0), 0x80);
        assert_eq!(f32_to_e4m3_satfinite(1e-40), 0x00);
        // Spec §2.3 worked example: 166.4 → 160 (0x72).
        assert_eq!(f32_to_e4m3_satfinite(166.4), 0x72);
    }
}
