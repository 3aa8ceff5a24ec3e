// The KV wire format and the transports, without an engine: checksums against a reference,
// header round trips and every way a header can be wrong, and the TCP transport's failure modes
// on loopback (a closed peer, a stalled peer, an oversized message, a refused connection), each a
// Status within its timeout.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <random>
#include <thread>

#include <gtest/gtest.h>

#include "disagg/kv_transfer.h"
#include "disagg/kv_transport.h"
#include "disagg/tcp_transport.h"

namespace tachyon::disagg {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::span<const uint8_t> bytes_of(std::string_view s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

// A small, made-up sequence export: 3 layers of 2 kv heads x head_dim 4, f32.
KvExport sample_export(int num_computed = 5, uint32_t seed = 7) {
  KvExport kv;
  kv.num_layers = 3;
  kv.num_kv_heads = 2;
  kv.head_dim = 4;
  kv.dtype = DType::kF32;
  kv.vocab_size = 100;
  kv.block_size = 16;
  for (int i = 0; i <= num_computed; ++i) kv.tokens.push_back((i * 37 + 11) % 100);
  kv.num_prompt_tokens = num_computed;
  kv.num_computed = num_computed;
  kv.sampler_seed = 0x1234567890abcdefull;
  kv.rng_draws = 1;
  std::mt19937 rng(seed);
  kv.layers.resize(3);
  for (auto& layer : kv.layers) {
    layer.resize(kv.layer_bytes());
    for (auto& b : layer) b = static_cast<uint8_t>(rng());
  }
  return kv;
}

void expect_same(const KvExport& a, const KvExport& b) {
  EXPECT_EQ(kv_model_shape(a), kv_model_shape(b));
  EXPECT_EQ(a.block_size, b.block_size);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.num_prompt_tokens, b.num_prompt_tokens);
  EXPECT_EQ(a.num_computed, b.num_computed);
  EXPECT_EQ(a.sampler_seed, b.sampler_seed);
  EXPECT_EQ(a.rng_draws, b.rng_draws);
  EXPECT_EQ(a.first_position, b.first_position);
  EXPECT_EQ(a.history_bits, b.history_bits);
  EXPECT_EQ(a.key_bounds, b.key_bounds);
  EXPECT_EQ(a.layers, b.layers);
}

TEST(Crc32c, KnownValuesAndFastEqualsReference) {
  // The check value of CRC-32C and the iSCSI test vector of 32 zero bytes (RFC 3720, B.4).
  EXPECT_EQ(crc32c(bytes_of("123456789")), 0xE3069283u);
  EXPECT_EQ(crc32c_reference(bytes_of("123456789")), 0xE3069283u);
  const std::vector<uint8_t> zeros(32, 0);
  EXPECT_EQ(crc32c(zeros), 0x8A9136AAu);
  EXPECT_EQ(crc32c({}), 0u);
  const uint32_t seed = std::random_device{}();
  std::mt19937 rng(seed);
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<uint8_t> data(rng() % 3000);
    for (auto& b : data) b = static_cast<uint8_t>(rng());
    const size_t cut = data.empty() ? 0 : rng() % data.size();
    const std::span<const uint8_t> all(data);
    EXPECT_EQ(crc32c(all), crc32c_reference(all)) << "seed " << seed;
    // Continuing from the result for a prefix gives the result for the whole.
    EXPECT_EQ(crc32c(all.subspan(cut), crc32c(all.first(cut))), crc32c(all)) << "seed " << seed;
  }
}

TEST(KvHeader, RoundTrips) {
  const KvExport kv = sample_export();
  auto header = encode_kv_header(kv, 42);
  ASSERT_TRUE(header.ok()) << header.status().to_string();
  auto decoded = decode_kv_header(*header, KvWireLimits{});
  ASSERT_TRUE(decoded.ok()) << decoded.status().to_string();
  EXPECT_EQ(decoded->transfer_id, 42u);
  KvExport meta = decoded->meta;
  meta.layers = kv.layers;
  expect_same(meta, kv);
  ASSERT_EQ(decoded->layer_crc.size(), 3u);
  EXPECT_EQ(decoded->layer_crc[1], crc32c(kv.layers[1]));
  EXPECT_EQ(decoded->layer_bytes[2], kv.layer_bytes());
}

TEST(KvHeader, EveryFlippedByteIsCaught) {
  auto header = encode_kv_header(sample_export(), 42);
  ASSERT_TRUE(header.ok());
  for (size_t i = 0; i < header->size(); ++i) {
    std::vector<uint8_t> bad = *header;
    bad[i] ^= 0x10;
    const auto decoded = decode_kv_header(bad, KvWireLimits{});
    ASSERT_FALSE(decoded.ok()) << "byte " << i;
    EXPECT_EQ(decoded.status().code(), ErrorCode::kCorruptFile) << decoded.status().to_string();
  }
}

TEST(KvHeader, BadHeadersAreClearErrors) {
  const KvExport kv = sample_export();
  auto header = encode_kv_header(kv, 1);
  ASSERT_TRUE(header.ok());
  // Truncated at every length.
  for (size_t n = 0; n < header->size(); ++n) {
    const auto d = decode_kv_header(std::span<const uint8_t>(*header).first(n), KvWireLimits{});
    ASSERT_FALSE(d.ok()) << n;
    EXPECT_EQ(d.status().code(), ErrorCode::kCorruptFile) << d.status().to_string();
  }
  // Bad magic.
  std::vector<uint8_t> bad = *header;
  bad[0] = 'X';
  auto d = decode_kv_header(bad, KvWireLimits{});
  EXPECT_EQ(d.status().code(), ErrorCode::kCorruptFile);
  EXPECT_NE(d.status().message().find("magic"), std::string::npos) << d.status().message();
  // Limits: the receiver refuses more tokens or bytes than it allows, before allocating.
  KvWireLimits tight;
  tight.max_tokens = 3;
  d = decode_kv_header(*header, tight);
  EXPECT_EQ(d.status().code(), ErrorCode::kCorruptFile);
  tight = KvWireLimits{};
  tight.max_layer_bytes = kv.layer_bytes() - 1;
  d = decode_kv_header(*header, tight);
  EXPECT_EQ(d.status().code(), ErrorCode::kCorruptFile);
  EXPECT_NE(d.status().message().find("limits"), std::string::npos) << d.status().message();
  // An export whose layers disagree with its shape cannot be encoded.
  KvExport short_layer = kv;
  short_layer.layers[1].pop_back();
  EXPECT_EQ(encode_kv_header(short_layer, 1).status().code(), ErrorCode::kInvalidArgument);
  KvExport i32 = kv;
  i32.dtype = DType::kI32;  // no KV cache holds it: no wire code
  EXPECT_EQ(encode_kv_header(i32, 1).status().code(), ErrorCode::kUnsupported);
  // An i8 export's layers carry the scales too: K and V codes, then K and V scales (f32).
  KvExport i8 = kv;
  i8.dtype = DType::kI8;
  EXPECT_EQ(encode_kv_header(i8, 1).status().code(), ErrorCode::kInvalidArgument);  // f32-sized layers
  for (auto& layer : i8.layers) layer.resize(i8.layer_bytes());
  EXPECT_EQ(i8.layer_bytes(), static_cast<size_t>(i8.num_computed) * 2 * i8.num_kv_heads * (i8.head_dim + 4));
  auto i8_header = encode_kv_header(i8, 1);
  ASSERT_TRUE(i8_header.ok()) << i8_header.status().to_string();
  auto i8_decoded = decode_kv_header(*i8_header, KvWireLimits{});
  ASSERT_TRUE(i8_decoded.ok()) << i8_decoded.status().to_string();
  EXPECT_EQ(i8_decoded->meta.dtype, DType::kI8);
  EXPECT_EQ(i8_decoded->layer_bytes[0], i8.layer_bytes());
}

// History travels in the layers: an int4 export of 40 computed positions of which the first 32
// (two blocks of 16) are history rows, with key bounds. The layer bytes count both parts, the
// header round-trips them, and a header whose history fields disagree with its shape is corrupt.
TEST(KvHeader, HistoryRoundTripsAndBadHistoryIsCorrupt) {
  KvExport kv = sample_export(40);
  kv.head_dim = 64;
  kv.first_position = 32;
  kv.history_bits = 4;
  kv.key_bounds = true;
  EXPECT_EQ(kv.history_blocks(), 2);
  // 8 full-precision positions of f32 K and V, 32 history rows of K and V (32 code bytes, 4 of
  // params), 2 blocks of key bounds (64 code bytes, 2 groups of f32 lo and step) per kv head.
  EXPECT_EQ(kv.layer_bytes(), size_t{8} * 2 * 2 * 64 * 4 + size_t{32} * 2 * 2 * 36 + size_t{2} * 2 * (64 + 16));
  for (auto& layer : kv.layers) layer.assign(kv.layer_bytes(), 0x5a);
  auto header = encode_kv_header(kv, 9);
  ASSERT_TRUE(header.ok()) << header.status().to_string();
  auto decoded = decode_kv_header(*header, KvWireLimits{});
  ASSERT_TRUE(decoded.ok()) << decoded.status().to_string();
  KvExport meta = decoded->meta;
  meta.layers = kv.layers;
  expect_same(meta, kv);
  EXPECT_EQ(decoded->layer_bytes[0], kv.layer_bytes());
  // Fields that cannot be: 3-bit history, history not ending on a block, bounds without history.
  for (int which = 0; which < 3; ++which) {
    KvExport bad = kv;
    if (which == 0) bad.history_bits = 3;
    if (which == 1) bad.first_position = 30;
    if (which == 2) bad.history_bits = 0;
    for (auto& layer : bad.layers) layer.assign(bad.layer_bytes(), 0x5a);
    EXPECT_EQ(encode_kv_header(bad, 9).status().code(), which == 2 ? ErrorCode::kOk : ErrorCode::kInvalidArgument)
        << which;
  }
  // The same, forged into a valid header (its checksum redone): corrupt, never a crash.
  const size_t fields = 4 + 2 + 2 + 4 + 4 * 10;  // the offset of history_bits
  for (const auto& [offset, value] : {std::pair{fields, 3u}, std::pair{fields + 4, 2u}, std::pair{fields - 4, 30u}}) {
    std::vector<uint8_t> bad = *header;
    for (int i = 0; i < 4; ++i) bad[offset + i] = static_cast<uint8_t>(value >> (8 * i));
    const uint32_t crc = crc32c(std::span<const uint8_t>(bad).first(bad.size() - 4));
    for (int i = 0; i < 4; ++i) bad[bad.size() - 4 + i] = static_cast<uint8_t>(crc >> (8 * i));
    const auto d = decode_kv_header(bad, KvWireLimits{});
    ASSERT_FALSE(d.ok()) << offset;
    EXPECT_EQ(d.status().code(), ErrorCode::kCorruptFile) << d.status().to_string();
  }
}

TEST(LocalTransport, CarriesATransferAndAnAck) {
  auto [a, b] = make_local_transport_pair();
  const KvExport kv = sample_export();
  ASSERT_TRUE(send_kv(*a, kv, 9, Millis(1000)).ok());
  KvReceiveOptions o;
  o.expect = kv_model_shape(kv);
  auto got = receive_kv(*b, o);
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_EQ(got->transfer_id, 9u);
  expect_same(got->kv, kv);
  ASSERT_TRUE(send_kv_ack(*b, 9, Status::Ok(), Millis(1000)).ok());
  EXPECT_TRUE(receive_kv_ack(*a, 9, Millis(1000)).ok());
  // An error travels back with its code.
  ASSERT_TRUE(send_kv_ack(*b, 10, make_error(ErrorCode::kOutOfRange, "no blocks"), Millis(1000)).ok());
  const Status nack = receive_kv_ack(*a, 10, Millis(1000));
  EXPECT_EQ(nack.code(), ErrorCode::kOutOfRange);
  EXPECT_EQ(nack.message(), "decode worker: no blocks");
  // A closed peer: the receiver fails because of the close, not at its timeout.
  b->close();
  const auto closed = a->receive(100, Millis(5000));
  EXPECT_EQ(closed.status().code(), ErrorCode::kIo);
  EXPECT_NE(closed.status().message().find("peer closed"), std::string::npos) << closed.status().message();
}

// A connected TCP pair on loopback.
struct TcpPair {
  std::unique_ptr<TcpKvTransport> client;
  std::unique_ptr<TcpKvTransport> server;
};

TcpPair connect_pair() {
  TcpPair p;
  auto listener = TcpKvListener::listen("127.0.0.1", 0);
  EXPECT_TRUE(listener.ok()) << listener.status().to_string();
  if (!listener.ok()) return p;
  auto client = TcpKvTransport::connect("127.0.0.1", (*listener)->port(), Millis(2000));
  EXPECT_TRUE(client.ok()) << client.status().to_string();
  auto server = (*listener)->accept(Millis(2000));
  EXPECT_TRUE(server.ok()) << server.status().to_string();
  if (client.ok() && server.ok()) {
    p.client = std::move(client).value();
    p.server = std::move(server).value();
  }
  return p;
}

TEST(TcpTransport, CarriesMessagesBothWays) {
  TcpPair p = connect_pair();
  ASSERT_TRUE(p.client && p.server);
  EXPECT_FALSE(p.server->peer().empty());
  // A transfer larger than the socket buffers needs the receiver running alongside.
  const KvExport big = sample_export(40000);
  std::thread sender([&] { EXPECT_TRUE(send_kv(*p.client, big, 5, Millis(5000)).ok()); });
  KvReceiveOptions o;
  o.wait_timeout = Millis(5000);
  o.timeout = Millis(5000);
  auto got = receive_kv(*p.server, o);
  sender.join();
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  expect_same(got->kv, big);
  ASSERT_TRUE(send_kv_ack(*p.server, 5, Status::Ok(), Millis(1000)).ok());
  EXPECT_TRUE(receive_kv_ack(*p.client, 5, Millis(1000)).ok());
  // Empty messages are messages too.
  ASSERT_TRUE(p.client->send({}, Millis(1000)).ok());
  auto empty = p.server->receive(0, Millis(1000));
  ASSERT_TRUE(empty.ok()) << empty.status().to_string();
  EXPECT_TRUE(empty->empty());
}

TEST(TcpTransport, ReceiveTimesOutOnASilentPeer) {
  TcpPair p = connect_pair();
  ASSERT_TRUE(p.client && p.server);
  const auto t0 = Clock::now();
  const auto r = p.server->receive(100, Millis(150));
  const double waited = seconds_since(t0);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kIo);
  EXPECT_NE(r.status().message().find("timed out"), std::string::npos) << r.status().message();
  EXPECT_GE(waited, 0.14);  // never before the timeout (a loaded machine only makes it later)
  // The transport is dropped after a failure: later calls fail at once.
  EXPECT_EQ(p.server->receive(100, Millis(1000)).status().code(), ErrorCode::kIo);
  EXPECT_EQ(p.server->send({}, Millis(1000)).code(), ErrorCode::kIo);
}

TEST(TcpTransport, OversizedMessageIsRefusedBeforeAllocation) {
  TcpPair p = connect_pair();
  ASSERT_TRUE(p.client && p.server);
  const std::vector<uint8_t> message(1000, 1);
  ASSERT_TRUE(p.client->send(message, Millis(1000)).ok());
  const auto r = p.server->receive(999, Millis(1000));
  EXPECT_EQ(r.status().code(), ErrorCode::kCorruptFile);
  EXPECT_NE(r.status().message().find("1000 bytes"), std::string::npos) << r.status().message();
}

TEST(TcpTransport, ForeignPeersAreErrors) {
  auto listener = TcpKvListener::listen("127.0.0.1", 0);
  ASSERT_TRUE(listener.ok());
  // A raw socket stands in for a peer that speaks something else.
  const auto raw_connect = [&] {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons((*listener)->port());
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    return fd;
  };
  // Its first 8 bytes read as a length near 2^64.
  int fd = raw_connect();
  auto server = (*listener)->accept(Millis(2000));
  ASSERT_TRUE(server.ok());
  const std::vector<uint8_t> junk(32, 0xff);
  ASSERT_EQ(::write(fd, junk.data(), junk.size()), 32);
  auto r = (*server)->receive(size_t{1} << 20, Millis(1000));
  EXPECT_EQ(r.status().code(), ErrorCode::kCorruptFile) << r.status().to_string();
  ::close(fd);
  // A well-framed message that is not a kv header.
  fd = raw_connect();
  server = (*listener)->accept(Millis(2000));
  ASSERT_TRUE(server.ok());
  std::vector<uint8_t> framed = {16, 0, 0, 0, 0, 0, 0, 0};
  framed.insert(framed.end(), 16, 0xab);
  ASSERT_EQ(::write(fd, framed.data(), framed.size()), 24);
  const auto kv = receive_kv(**server, KvReceiveOptions{});
  EXPECT_EQ(kv.status().code(), ErrorCode::kCorruptFile) << kv.status().to_string();
  ::close(fd);
}

TEST(TcpTransport, PeerClosingMidMessageIsAnErrorWithinTheTimeout) {
  TcpPair p = connect_pair();
  ASSERT_TRUE(p.client && p.server);
  // The header and one layer of three, then the sender goes away.
  const KvExport kv = sample_export();
  auto header = encode_kv_header(kv, 3);
  ASSERT_TRUE(header.ok());
  ASSERT_TRUE(p.client->send(*header, Millis(1000)).ok());
  ASSERT_TRUE(p.client->send(kv.layers[0], Millis(1000)).ok());
  p.client->close();
  KvReceiveOptions o;
  o.timeout = Millis(3000);
  const auto r = receive_kv(*p.server, o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kIo);
  EXPECT_NE(r.status().message().find("layer 1"), std::string::npos) << r.status().message();
  // It ended because the peer closed, not at the timeout.
  EXPECT_NE(r.status().message().find("closed"), std::string::npos) << r.status().message();
  EXPECT_EQ(r.status().message().find("timed out"), std::string::npos) << r.status().message();
}

TEST(TcpTransport, StalledSenderTimesOut) {
  TcpPair p = connect_pair();
  ASSERT_TRUE(p.client && p.server);
  const KvExport kv = sample_export();
  auto header = encode_kv_header(kv, 3);
  ASSERT_TRUE(header.ok());
  ASSERT_TRUE(p.client->send(*header, Millis(1000)).ok());  // and nothing more, connection kept open
  KvReceiveOptions o;
  o.timeout = Millis(200);
  const auto t0 = Clock::now();
  const auto r = receive_kv(*p.server, o);
  const double waited = seconds_since(t0);
  EXPECT_EQ(r.status().code(), ErrorCode::kIo);
  EXPECT_NE(r.status().message().find("timed out"), std::string::npos) << r.status().message();
  EXPECT_GE(waited, 0.19);  // never before the timeout
}

TEST(TcpTransport, ConnectAndAcceptFailCleanly) {
  // A port that was just free: nothing listens there.
  uint16_t port = 0;
  {
    auto l = TcpKvListener::listen("127.0.0.1", 0);
    ASSERT_TRUE(l.ok());
    port = (*l)->port();
  }
  const auto refused = TcpKvTransport::connect("127.0.0.1", port, Millis(2000));
  EXPECT_EQ(refused.status().code(), ErrorCode::kIo);
  EXPECT_EQ(TcpKvListener::listen("not an address", 0).status().code(), ErrorCode::kInvalidArgument);
  auto l = TcpKvListener::listen("127.0.0.1", 0);
  ASSERT_TRUE(l.ok());
  // Nobody connects: accept() gives up at its timeout.
  const auto none = (*l)->accept(Millis(100));
  EXPECT_EQ(none.status().code(), ErrorCode::kIo);
  EXPECT_NE(none.status().message().find("no connection"), std::string::npos) << none.status().message();
}

}  // namespace
}  // namespace tachyon::disagg
