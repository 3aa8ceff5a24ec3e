// The listening socket of the server and the router: bound to an IP address (not a name), with
// address reuse, at the largest backlog; port 0 picks a free one (read it back from the acceptor).
#pragma once

#include <string>

#include <boost/asio/ip/tcp.hpp>

#include "core/status.h"

namespace tachyon::net {

// kInvalidArgument when `host` is not an IP address, kIo when the port cannot be bound.
Status listen_on(boost::asio::ip::tcp::acceptor& acceptor, const std::string& host, int port);

}  // namespace tachyon::net
