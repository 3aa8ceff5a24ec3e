#include "net/listener.h"

namespace tachyon::net {

Status listen_on(boost::asio::ip::tcp::acceptor& acceptor, const std::string& host, int port) {
  namespace asio = boost::asio;
  boost::system::error_code ec;
  const asio::ip::address address = asio::ip::make_address(host, ec);
  if (ec) return make_error(ErrorCode::kInvalidArgument, "--host '{}' is not an IP address: {}", host, ec.message());
  const asio::ip::tcp::endpoint endpoint(address, static_cast<unsigned short>(port));
  acceptor.open(endpoint.protocol(), ec);
  if (!ec) acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) acceptor.bind(endpoint, ec);
  if (!ec) acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) return make_error(ErrorCode::kIo, "cannot listen on {}:{}: {}", host, port, ec.message());
  return Status::Ok();
}

}  // namespace tachyon::net
