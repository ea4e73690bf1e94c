// Portable bit-level conversions (OCP e4m3fn, bf16). Used where the hardware
// has no matching instruction: gfx942 converts only e4m3 *FNUZ* natively, which
// is a different format from the e4m3fn bytes our caches hold.
#pragma once
#include "nsa/common/types.cuh"

namespace nsa {
namespace soft {

NSA_DEVICE u32 f32_bits(float f) { return __builtin_bit_cast(u32, f); }
NSA_DEVICE float bits_f32(u32 b) { return __builtin_bit_cast(float, b); }

// f32 -> bf16, round to nearest even; NaN -> 0x7fff, the canonical NaN that
// PTX cvt.rn.bf16.f32 produces, so both vendors write identical bytes.
NSA_DEVICE u16 f32_to_bf16(float f) {
  u32 b = f32_bits(f);
  if ((b & 0x7fffffffu) > 0x7f800000u) return (u16)0x7fffu;
  return (u16)((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
}

// f32 -> e4m3fn, round to nearest even, saturating to +-448 (inf too); NaN -> 0x7f|sign.
NSA_DEVICE u8 f32_to_e4m3_satfinite(float f) {
  const u32 b = f32_bits(f);
  const u32 sign = (b >> 24) & 0x80u;
  const u32 mag = b & 0x7fffffffu;
  if (mag > 0x7f800000u) return (u8)(sign | 0x7fu);
  if (mag >= 0x43e00000u) return (u8)(sign | 0x7eu);  // >= 448
  const i32 exp = (i32)(mag >> 23) - 127;
  if (exp >= -6) {  // normal e4m3: rebias 127 -> 7, keep 3 mantissa bits (RNE)
    u32 t = mag - (120u << 23);
    t = (t + 0x7ffffu + ((t >> 20) & 1u)) >> 20;
    return (u8)(sign | t);
  }
  if (exp == -127) return (u8)sign;  // f32 zero/subnormal: far below e4m3's smallest step
  // subnormal e4m3: value = m * 2^-9; m = RNE(mant * 2^(exp-14)); m == 8 is the min normal.
  const u32 mant = (mag & 0x7fffffu) | 0x800000u;
  const u32 shift = (u32)(14 - exp);
  if (shift >= 32) return (u8)sign;
  const u32 rem = mant & ((1u << shift) - 1u);
  const u32 half = 1u << (shift - 1u);
  u32 m = mant >> shift;
  if (rem > half || (rem == half && (m & 1u))) m += 1u;
  return (u8)(sign | m);
}

// e4m3fn -> f32 (exact).
NSA_DEVICE float e4m3_to_f32(u8 v) {
  const u32 sign = (u32)(v & 0x80u) << 24;
  const u32 e = (v >> 3) & 0xfu;
  const u32 m = v & 7u;
  if (e == 0xfu && m == 7u) return bits_f32(sign | 0x7fc00000u);
  if (e == 0u) return bits_f32(sign | f32_bits((float)m * 0.001953125f));  // m * 2^-9
  return bits_f32(sign | ((e + 120u) << 23) | (m << 20));
}

}  // namespace soft
}  // namespace nsa
