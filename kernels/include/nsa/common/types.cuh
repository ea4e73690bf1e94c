// Fixed-width types and 16-byte vectors without any toolkit header.
#pragma once

namespace nsa {
typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;
typedef int i32;
typedef long long i64;

// 16 bytes moved as one vector load/store (LDG.128 / global_load_dwordx4).
struct alignas(16) Vec16 {
  u32 w[4];
};
// 8 bytes moved as one vector load/store.
struct alignas(8) Vec8 {
  u32 w[2];
};

constexpr float kE4m3Max = 448.0f;
constexpr float kF32MaxFinite = 3.40282347e+38f;
}  // namespace nsa
