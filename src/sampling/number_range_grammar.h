// Numeric ranges as grammars, for JSON Schema's minimum / maximum / exclusiveMinimum / exclusiveMaximum.
// Integers: exact for any int64 bounds ("-" only on negatives, no leading zeros, no "-0").
// Decimals: exact for bounds that are whole numbers (0, 1, 100, -5; inclusive or exclusive), written without
// an exponent ("-12.5", "0", "3.000"); other bounds are the caller's to refuse.
// Unbounded magnitudes are limited to max_digits digits before the point and max_fraction_digits after, so
// that a model cannot write digits forever.
// Must never: produce a number outside the range (tests check every integer of a window by brute force).
#pragma once

#include <cstdint>
#include <optional>

#include "core/status.h"
#include "sampling/grammar.h"

namespace tachyon {

struct NumberBound {
  int64_t value = 0;
  bool exclusive = false;
};

struct NumberDigits {
  int max_digits = 16;           // digits before the point when the range has no upper limit there
  int max_fraction_digits = 16;  // digits after the point
};

// JSON integers n with min <= n <= max (a missing bound: no limit). An error when the range is empty.
Result<GrammarExpr> integer_range_expr(std::optional<int64_t> min, std::optional<int64_t> max,
                                       NumberDigits digits = {});

// JSON numbers x (no exponent) with min <(=) x <(=) max at whole-number bounds. An error when it is empty.
Result<GrammarExpr> decimal_range_expr(std::optional<NumberBound> min, std::optional<NumberBound> max,
                                       NumberDigits digits = {});

}  // namespace tachyon
