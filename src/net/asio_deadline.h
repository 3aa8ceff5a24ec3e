// Blocking calls with deadlines over Asio, shared by the HTTP client, the router's client
// connections and the KV transport: each call starts Asio's asynchronous form on its own
// io_context and runs that context for at most the time left; an operation still pending then is
// cancelled. Only .cpp files include this (it brings in Asio).
#pragma once

#include <algorithm>
#include <chrono>

#include <boost/asio/io_context.hpp>

namespace tachyon::net {

// The time left until `deadline`, never negative.
inline std::chrono::milliseconds remaining(std::chrono::steady_clock::time_point deadline) {
  using std::chrono::milliseconds;
  return std::max(milliseconds(0), std::chrono::duration_cast<milliseconds>(deadline - std::chrono::steady_clock::now()));
}

// Runs `io` until the operation started on it completes (its handler sets `done`) or `timeout`
// passes; then cancels it with `cancel` and runs the cancelled handler. An operation that timed
// out completes with operation_aborted (nothing else cancels), one that finished in time with its
// own result.
template <typename Cancel>
void run_with_timeout(boost::asio::io_context& io, const bool& done, std::chrono::milliseconds timeout,
                      Cancel cancel) {
  io.restart();
  if (timeout > std::chrono::milliseconds(0)) io.run_for(timeout);
  if (done) return;
  cancel();
  io.restart();
  io.run();
}

}  // namespace tachyon::net
