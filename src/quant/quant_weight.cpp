#include "quant/quant_weight.h"

namespace tachyon {

const char* quant_format_name(QuantFormat format) {
  switch (format) {
    case QuantFormat::kGgufQ8_0: return "q8_0";
    case QuantFormat::kGgufQ4_K: return "q4_k";
    case QuantFormat::kGgufQ6_K: return "q6_k";
    case QuantFormat::kGgufQ4_1: return "q4_1";
    case QuantFormat::kGgufQ5_0: return "q5_0";
    case QuantFormat::kGgufQ5_1: return "q5_1";
    case QuantFormat::kGgufQ5_K: return "q5_k";
    case QuantFormat::kGgufIq4Nl: return "iq4_nl";
    case QuantFormat::kW8A8: return "w8a8";
    case QuantFormat::kTernary: return "ternary";
    case QuantFormat::kFp8Channel: return "fp8";
    case QuantFormat::kInt8Channel: return "int8";
    case QuantFormat::kInt4Group: return "int4";
  }
  return "?";
}

size_t Weight::nbytes() const {
  if (!quant) return dense.defined() ? dense.nbytes() : 0;
  size_t n = quant->packed.nbytes();
  if (quant->scales.defined()) n += quant->scales.nbytes();
  if (quant->zeros.defined()) n += quant->zeros.nbytes();
  return n;
}

}  // namespace tachyon
