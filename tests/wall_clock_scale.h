// How much longer a test may wait on the wall clock in this build: the sanitizer build (make
// sanitize: ASan + UBSan, -O1, asserts on) runs several times slower than Release.
#pragma once

namespace tachyon::testing {

// Wall-clock bounds in tests ("a hostile input ends within N s") are multiplied by this: the
// sanitizer build (make sanitize: ASan + UBSan, -O1, asserts on) runs several times slower than
// Release, and a bound meant to catch a quadratic blow-up still does at 5x.
#if defined(__SANITIZE_ADDRESS__)
inline constexpr double kWallClockScale = 5.0;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
inline constexpr double kWallClockScale = 5.0;
#else
inline constexpr double kWallClockScale = 1.0;
#endif
#else
inline constexpr double kWallClockScale = 1.0;
#endif

}  // namespace tachyon::testing
