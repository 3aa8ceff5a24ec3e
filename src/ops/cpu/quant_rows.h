// How the quantized linears walk their output rows (quant_linear_avx2.cpp and the AVX-512 files):
// blocks of `row_block` rows, each finished for every token before the next (a block's packed rows
// stay in L1 while all token tiles pass over them), tiles of TMax tokens and then one smaller tile.
// A call of at most TMax tokens (decode) has one tile per row and nothing to reuse across tiles:
// it walks the two halves of its rows in turn instead, so that two weight streams are in flight,
// each with its kernel's software prefetch ahead of it. One core's misses to one stream cap it near
// 12 GB/s on a 15 GB/s core here (`tachyon_bench bandwidth`: 1 stream against 4); on a 4864 x 896
// Q8_0 matrix, one thread, the two halves took the kernel from 72 % to 95 % of the read bandwidth
// (4096 x 4096 Q4_K 64 -> 77 %, Q6_K 58 -> 69 %; four streams were no better, eight worse;
// docs/perf.md 2026-12-06).
// Each instantiation takes a tile callable of its own translation unit, so kernels compiled for
// different instruction sets never share an instantiation.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "ops/cpu/quant_linear.h"

namespace tachyon::ops::cpu {

// `tile` is called as tile(std::integral_constant<int, T>{}, o, tok0) for a tile of T tokens at row o.
template <int TMax, typename Tile>
inline void run_rows(const QuantLinearArgs& a, int64_t o_begin, int64_t o_end, int64_t row_block, const Tile& tile) {
  static_assert(TMax >= 1 && TMax <= 4, "extend the remainder tiles below");
  if (a.n <= TMax) {
    const auto two_streams = [&](auto tokens) {
      const int64_t half = (o_end - o_begin + 1) / 2;
      for (int64_t i = 0; i < half; ++i) {
        tile(tokens, o_begin + i, 0);
        if (o_begin + half + i < o_end) tile(tokens, o_begin + half + i, 0);
      }
    };
    if (a.n == TMax) return two_streams(std::integral_constant<int, TMax>{});
    if constexpr (TMax > 1) {
      if (a.n == 1) return two_streams(std::integral_constant<int, 1>{});
    }
    if constexpr (TMax > 2) {
      if (a.n == 2) return two_streams(std::integral_constant<int, 2>{});
    }
    if constexpr (TMax > 3) {
      if (a.n == 3) return two_streams(std::integral_constant<int, 3>{});
    }
  }
  for (int64_t r0 = o_begin; r0 < o_end; r0 += row_block) {
    const int64_t r1 = std::min(o_end, r0 + row_block);
    int64_t t = 0;
    for (; t + TMax <= a.n; t += TMax) {
      for (int64_t o = r0; o < r1; ++o) tile(std::integral_constant<int, TMax>{}, o, t);
    }
    const int64_t rest = a.n - t;
    for (int64_t o = r0; o < r1; ++o) {
      if constexpr (TMax > 1) {
        if (rest == 1) tile(std::integral_constant<int, 1>{}, o, t);
      }
      if constexpr (TMax > 2) {
        if (rest == 2) tile(std::integral_constant<int, 2>{}, o, t);
      }
      if constexpr (TMax > 3) {
        if (rest == 3) tile(std::integral_constant<int, 3>{}, o, t);
      }
    }
  }
}

}  // namespace tachyon::ops::cpu
