// One client connection of the router, served by its own thread with blocking calls under
// deadlines (net/asio_deadline.h) on its own io_context, so that a request's flow reads top to
// bottom. A write that fails or stalls past its timeout marks the client gone; the request being
// served then stops at its next write.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/message.hpp>
#include <boost/beast/http/string_body.hpp>

#include "net/http_client.h"

namespace tachyon::router {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using error_code = boost::system::error_code;
using Clock = std::chrono::steady_clock;
using net::Millis;

// The options' seconds as a timeout.
inline Millis millis(double seconds) { return Millis(static_cast<int64_t>(seconds * 1000)); }
// Waits that must notice a drain or a stop (an idle connection, a held request, the accept loop)
// run in slices of this length.
inline constexpr Millis kSlice{100};

class ClientConnection {
 public:
  asio::io_context io{1};
  tcp::socket socket{io};
  beast::flat_buffer buffer;
  bool gone = false;  // a write failed or timed out: the client counts as gone

  // Waits for the next request's first bytes in slices, so that a drain can end an idle
  // connection; false when the connection should close.
  bool wait_for_request(double keep_alive, const std::atomic<bool>& draining);
  // The request, or the status to answer with (0: close silently).
  std::optional<http::request<http::string_body>> read_request(size_t max_body, Millis timeout, int& error_status,
                                                               std::string& error_message);
  bool write(std::string_view bytes, double timeout);
  void close();
};

}  // namespace tachyon::router
