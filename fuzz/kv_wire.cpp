// Fuzz target: the KV wire protocol of disaggregated serving (disagg/kv_transfer.h): header,
// device-region and ack messages, and a whole transfer received over the in-process transport.
// Every message ends with a CRC-32C of its other bytes, which random bytes almost never match, so
// each message is also tried with its checksum made right (the fuzzer then reaches the checks
// behind it). The input is split into messages as [u32 length][bytes]...; each message is also
// decoded alone.
#include <cstring>
#include <vector>

#include "disagg/kv_transfer.h"
#include "disagg/kv_transport.h"
#include "fuzz_util.h"

namespace {

using tachyon::disagg::Millis;

uint32_t read_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// `message` with its last four bytes replaced by the CRC-32C of the bytes before them.
std::vector<uint8_t> with_checksum(std::vector<uint8_t> message) {
  if (message.size() < 4) return message;
  const uint32_t crc = tachyon::disagg::crc32c({message.data(), message.size() - 4});
  std::memcpy(message.data() + message.size() - 4, &crc, 4);
  return message;
}

// The transfer id a region or ack message names (bytes 8..15), so that its check passes.
uint64_t transfer_id_of(const std::vector<uint8_t>& message) {
  uint64_t id = 0;
  if (message.size() >= 16) std::memcpy(&id, message.data() + 8, 8);
  return id;
}

void decode_alone(const std::vector<uint8_t>& message) {
  const tachyon::disagg::KvWireLimits limits;
  (void)tachyon::disagg::decode_kv_header(message, limits);
  (void)tachyon::disagg::decode_kv_region(message, transfer_id_of(message));
  // An ack, through a transport (receive_kv_ack reads one message).
  auto [sender, receiver] = tachyon::disagg::make_local_transport_pair();
  (void)sender->send(message, Millis(100));
  sender->close();
  (void)tachyon::disagg::receive_kv_ack(*receiver, transfer_id_of(message), Millis(100));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  tachyon::fuzz::quiet_logs();
  std::vector<std::vector<uint8_t>> messages;
  for (size_t at = 0; at + 4 <= size;) {
    const size_t length = std::min<size_t>(read_u32(data + at), size - at - 4);
    messages.emplace_back(data + at + 4, data + at + 4 + length);
    at += 4 + length;
  }
  const std::vector<uint8_t> whole(data, data + size);
  decode_alone(whole);
  decode_alone(with_checksum(whole));
  if (messages.empty()) return 0;
  messages.front() = with_checksum(messages.front());
  for (const auto& message : messages) decode_alone(message);

  // One whole transfer: the header (checksum made right), then the layers or the region.
  auto [sender, receiver] = tachyon::disagg::make_local_transport_pair();
  for (const auto& message : messages) (void)sender->send(message, Millis(100));
  sender->close();
  tachyon::disagg::KvReceiveOptions options;
  options.wait_timeout = Millis(100);
  options.timeout = Millis(100);
  auto received = tachyon::disagg::receive_kv(*receiver, options);
  (void)received;
  return 0;
}
