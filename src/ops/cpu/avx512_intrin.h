// <immintrin.h> for the files compiled with AVX-512 flags (*_avx512.cpp, *_vnni.cpp). GCC 12 warns
// about the self-initialised "undefined" vectors inside its own AVX-512 headers (a false positive
// of the header's idiom, not of the including file), so the include is wrapped.
#pragma once

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
