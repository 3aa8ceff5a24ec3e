// Numeric range grammars. Magnitudes are handled as unsigned decimal strings: a range [a, b] of non-negative
// integers splits by digit count into same-length ranges, and a same-length range [x, y] is written digit by
// digit (common prefix, then x's tail up to 9s, the digits strictly between, and y's tail from 0s). Signed and
// decimal ranges are assembled from those magnitude ranges.
#include "sampling/number_range_grammar.h"

#include <algorithm>
#include <string>
#include <vector>

namespace tachyon {

namespace {

GrammarExpr digit() { return GrammarExpr::chars(CharClass::range('0', '9')); }
GrammarExpr digits(int count) { return GrammarExpr::repeat(digit(), count, count); }
GrammarExpr never() { return GrammarExpr::chars(CharClass()); }

int num_digits(uint64_t v) {
  int n = 1;
  while (v >= 10) {
    v /= 10;
    ++n;
  }
  return n;
}

uint64_t pow10(int n) {
  uint64_t v = 1;
  for (int i = 0; i < n; ++i) v *= 10;
  return v;
}

// Digit strings of equal length between x and y (x <= y), leading zeros included as written.
GrammarExpr same_length_range(const std::string& x, const std::string& y) {
  if (x.empty()) return GrammarExpr::empty();
  const size_t n = x.size() - 1;
  const std::string x_tail = x.substr(1);
  const std::string y_tail = y.substr(1);
  if (x[0] == y[0]) return GrammarExpr::sequence({GrammarExpr::code_point(x[0]), same_length_range(x_tail, y_tail)});
  if (x_tail == std::string(n, '0') && y_tail == std::string(n, '9')) {
    return GrammarExpr::sequence({GrammarExpr::chars(CharClass::range(x[0], y[0])), digits(static_cast<int>(n))});
  }
  std::vector<GrammarExpr> choices;
  choices.push_back(
      GrammarExpr::sequence({GrammarExpr::code_point(x[0]), same_length_range(x_tail, std::string(n, '9'))}));
  if (y[0] - x[0] >= 2) {
    choices.push_back(
        GrammarExpr::sequence({GrammarExpr::chars(CharClass::range(x[0] + 1, y[0] - 1)), digits(static_cast<int>(n))}));
  }
  choices.push_back(
      GrammarExpr::sequence({GrammarExpr::code_point(y[0]), same_length_range(std::string(n, '0'), y_tail)}));
  return GrammarExpr::alternation(std::move(choices));
}

// Non-negative integers in [a, b] without leading zeros; b missing: up to max(max_digits, digits of a) digits.
GrammarExpr magnitude_range(uint64_t a, std::optional<uint64_t> b, int max_digits) {
  const int la = num_digits(a);
  const int lb = b ? num_digits(*b) : std::max(max_digits, la);
  std::vector<GrammarExpr> choices;
  for (int length = la; length <= lb && length <= 20; ++length) {
    uint64_t lo = length == 1 ? 0 : pow10(length - 1);
    uint64_t hi = length >= 20 ? UINT64_MAX : pow10(length) - 1;
    lo = std::max(lo, a);
    if (b) hi = std::min(hi, *b);
    if (lo <= hi) choices.push_back(same_length_range(std::to_string(lo), std::to_string(hi)));
  }
  if (choices.empty()) return never();
  return GrammarExpr::alternation(std::move(choices));
}

uint64_t magnitude_of_negative(int64_t v) { return static_cast<uint64_t>(-(v + 1)) + 1; }  // v < 0, no overflow

// Magnitude bounds of a decimal range within [0, inf): lower (value, exclusive), upper optional.
GrammarExpr nonnegative_decimal(uint64_t a, bool a_exclusive, std::optional<std::pair<uint64_t, bool>> b,
                                const NumberDigits& d) {
  const GrammarExpr fraction_any = GrammarExpr::optional(
      GrammarExpr::sequence({GrammarExpr::code_point('.'), GrammarExpr::repeat(digit(), 1, d.max_fraction_digits)}));
  const GrammarExpr fraction_zero = GrammarExpr::optional(GrammarExpr::sequence(
      {GrammarExpr::code_point('.'), GrammarExpr::repeat(GrammarExpr::code_point('0'), 1, d.max_fraction_digits)}));
  // A fraction above zero: zeros, one non-zero digit, anything.
  const GrammarExpr fraction_positive = GrammarExpr::sequence(
      {GrammarExpr::code_point('.'), GrammarExpr::repeat(GrammarExpr::code_point('0'), 0, d.max_fraction_digits - 1),
       GrammarExpr::chars(CharClass::range('1', '9')), GrammarExpr::repeat(digit(), 0, d.max_fraction_digits - 1)});
  auto exact = [](uint64_t v) { return GrammarExpr::literal(std::to_string(v)); };
  std::vector<GrammarExpr> choices;
  if (b && b->first == a) {
    if (!a_exclusive && !b->second) choices.push_back(GrammarExpr::sequence({exact(a), fraction_zero}));
  } else if (!b || b->first > a) {
    choices.push_back(GrammarExpr::sequence({exact(a), a_exclusive ? fraction_positive : fraction_any}));
    if (!b) {
      choices.push_back(GrammarExpr::sequence({magnitude_range(a + 1, std::nullopt, d.max_digits), fraction_any}));
    } else if (b->first - a >= 2) {
      choices.push_back(GrammarExpr::sequence({magnitude_range(a + 1, b->first - 1, d.max_digits), fraction_any}));
    }
    if (b && !b->second) choices.push_back(GrammarExpr::sequence({exact(b->first), fraction_zero}));
  }
  if (choices.empty()) return never();
  return GrammarExpr::alternation(std::move(choices));
}

}  // namespace

Result<GrammarExpr> integer_range_expr(std::optional<int64_t> min, std::optional<int64_t> max, NumberDigits d) {
  if (min && max && *min > *max) {
    return make_error(ErrorCode::kInvalidArgument, "integer range [{}, {}] is empty", *min, *max);
  }
  std::vector<GrammarExpr> choices;
  if (!min || *min < 0) {  // negatives
    const uint64_t low = (max && *max < 0) ? magnitude_of_negative(*max) : 1;
    std::optional<uint64_t> high;
    if (min) high = magnitude_of_negative(*min);
    choices.push_back(GrammarExpr::sequence({GrammarExpr::code_point('-'), magnitude_range(low, high, d.max_digits)}));
  }
  if (!max || *max >= 0) {  // zero and positives
    const uint64_t low = (min && *min > 0) ? static_cast<uint64_t>(*min) : 0;
    std::optional<uint64_t> high;
    if (max) high = static_cast<uint64_t>(*max);
    choices.push_back(magnitude_range(low, high, d.max_digits));
  }
  return GrammarExpr::alternation(std::move(choices));
}

Result<GrammarExpr> decimal_range_expr(std::optional<NumberBound> min, std::optional<NumberBound> max, NumberDigits d) {
  if (min && max && (min->value > max->value || (min->value == max->value && (min->exclusive || max->exclusive)))) {
    return make_error(ErrorCode::kInvalidArgument, "number range {}{}, {}{} is empty", min->exclusive ? "(" : "[",
                      min->value, max->value, max->exclusive ? ")" : "]");
  }
  std::vector<GrammarExpr> choices;
  // x < 0: magnitude m = -x in (0, -min] when max >= 0, else [-max, -min] (exclusivity follows the bound).
  if (!min || min->value < 0) {
    uint64_t low = 0;
    bool low_exclusive = true;
    if (max && max->value < 0) {
      low = magnitude_of_negative(max->value);
      low_exclusive = max->exclusive;
    }
    std::optional<std::pair<uint64_t, bool>> high;
    if (min) high = std::make_pair(magnitude_of_negative(min->value), min->exclusive);
    choices.push_back(
        GrammarExpr::sequence({GrammarExpr::code_point('-'), nonnegative_decimal(low, low_exclusive, high, d)}));
  }
  // x >= 0.
  if (!max || max->value > 0 || (max->value == 0 && !max->exclusive)) {
    uint64_t low = 0;
    bool low_exclusive = false;
    if (min && min->value >= 0) {
      low = static_cast<uint64_t>(min->value);
      low_exclusive = min->exclusive;
    }
    std::optional<std::pair<uint64_t, bool>> high;
    if (max) high = std::make_pair(static_cast<uint64_t>(max->value), max->exclusive);
    choices.push_back(nonnegative_decimal(low, low_exclusive, high, d));
  }
  return GrammarExpr::alternation(std::move(choices));
}

}  // namespace tachyon
