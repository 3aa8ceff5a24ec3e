// Moving one sequence's KV from a prefill worker to a decode worker: the wire format and the two
// ends of a transfer, over any KvTransport (kv_transport.h).
//
// How the roles and the router use these pieces (`tachyon serve --role prefill|decode`,
// `tachyon router`; the HTTP side is server/disagg_protocol.h, the glue server/disagg_worker.h):
//   - Both roles run the same Engine on the same model. The router admits a request, picks a
//     decode worker (server/router_policy.h: the shortest queue, then the most free KV blocks, from
//     the workers' polled EngineStats), registers the request there under a fresh transfer id,
//     and gives a prefill worker the request with the decode worker's KV address; the prefill
//     worker runs it with GenerationParams::prefill_only.
//   - Prefill worker: its engine loop runs the prompt; the request's output ends with
//     FinishReason::kTransfer and carries the first token and its text, which the router streams
//     to the client at once (time to first token does not wait for the transfer). The engine
//     thread calls export_kv() (kv_export.h) right after that step (a copy to the host, or with
//     --kv-transport cuda-ipc into a region of the KvStagingPool's GPU memory, kv_staging.h; the
//     blocks are freed at once) and hands the export to a KvSender (kv_sender.h), whose threads call
//     send_kv() on a pooled connection to that decode worker, then receive_kv_ack(); the export,
//     and so its region, is dropped after the ack. A request
//     that a stop condition ends at its first token finishes as usual and is never transferred.
//   - Decode worker: a KvReceiver (kv_receiver.h) thread per incoming connection loops on
//     receive_kv() and hands each ReceivedKv, with the request registered under its transfer id
//     (the client's GenerationParams), to its engine loop, which calls adopt() (kv_export.h) and
//     streams the following tokens to the router; the adopt() outcome goes back with
//     send_kv_ack(), and an unknown transfer id is refused. kOutOfRange from adopt() (no blocks,
//     or max_seqs reached) is backpressure: the import stays queued and is retried after each
//     step (bounded), and the router holds new requests while every decode worker's queue or free
//     KV is past its limit.
//   - Errors: any failed transfer ends the request with an error at the router (the prefill
//     worker already freed its blocks; the decode worker adopted nothing), and the connection is
//     dropped and reconnected (a transport that failed once is never reused).
//   - `--role both` is a plain engine. make_local_transport_pair() serves tests (and a future
//     single process playing both roles) in place of TCP.
//
// Wire format, version 3, all integers little-endian. One transfer is 1 + num_layers messages:
//   header  u32 magic "TKVH", u16 version, u16 flags (0), u32 header bytes (this whole message),
//           u32 num_layers, num_kv_heads, head_dim, dtype (1 f32, 2 f16, 3 bf16, 4 i8, 5 f8e4m3), vocab_size,
//           block_size, num_tokens, num_prompt_tokens, num_computed, first_position,
//           history_bits (0, 8, 4), history_flags (bit 0: key bounds),
//           u64 transfer_id, sampler_seed, rng_draws,
//           u64 layer_bytes[num_layers], u32 layer_crc32c[num_layers], i32 tokens[num_tokens],
//           u32 crc32c of every header byte before it
//   layer l K then V of positions [first_position, num_computed), each [n, num_kv_heads, head_dim]
//           (n = num_computed - first_position; first_position > 0 when the exporter dropped older
//           history) in dtype, then for i8 / f8e4m3 the K then V scales, each [n, num_kv_heads]
//           f32 (ops.h KvLayer); with history_bits, the history of positions [0, first_position)
//           as KvExport::layers lays it out (rows, then key bounds); exactly layer_bytes[l] bytes,
//           its CRC-32C in the header
// With header flag 1 (kKvFlagDeviceRegion) the layers are not sent: they lie, layer after layer,
// in device memory the receiver maps (CUDA IPC, between processes of one host), and one region
// message follows the header instead: u32 magic "TKVD", u16 version, u16 flags (0), u64
// transfer_id, u64 offset, u64 bytes (num_layers * layer_bytes), u32 handle length (at most 256),
// the handle (a cudaIpcMemHandle_t for CUDA), u32 crc32c of the bytes before it. The header's
// layer checksums are then 0: the bytes never pass through the host. The sender keeps the region
// until the ack (the receiver's copies out of it have finished by then).
// The receiver checks every size against the shape and its limits before it allocates, and every
// checksum; the checksums are always computed (CRC-32C, with the SSE4.2 instruction where the
// CPU has it). A decode worker answers each transfer with an ack message: u32 magic "TKVA", u16
// version, u16 flags, u64 transfer_id, u32 status code, u32 message length, the message (at most
// 4 KiB), u32 crc32c of the bytes before it.
//
// Errors are Status values, never aborts: kIo (peer closed, timeout), kCorruptFile (bad magic, a
// checksum or a size that disagrees with the header, sizes past the limits), kUnsupported (another
// version, an unknown dtype), kInvalidArgument (a model shape other than the expected one).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "disagg/kv_export.h"
#include "disagg/kv_transport.h"

namespace tachyon::disagg {

inline constexpr uint32_t kKvHeaderMagic = 0x48564b54;  // "TKVH"
inline constexpr uint32_t kKvAckMagic = 0x41564b54;     // "TKVA"
inline constexpr uint32_t kKvRegionMagic = 0x44564b54;  // "TKVD"
inline constexpr uint16_t kKvWireVersion = 3;
inline constexpr uint16_t kKvFlagDeviceRegion = 1;

// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78) of `bytes`, continuing from `crc` (the
// result for the bytes before them; 0 to start). SSE4.2's crc32 instruction where the build has
// it, else crc32c_reference().
uint32_t crc32c(std::span<const uint8_t> bytes, uint32_t crc = 0);
// The same, a byte at a time from a table: the reference the fast path is tested against.
uint32_t crc32c_reference(std::span<const uint8_t> bytes, uint32_t crc = 0);

// What must agree between the two sides for K/V to be usable (the block size need not).
struct KvModelShape {
  int num_layers = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  DType dtype = DType::kF32;
  int vocab_size = 0;
  bool operator==(const KvModelShape&) const = default;
  std::string to_string() const;  // "10 layers x 2 kv heads x head_dim 64, f32, vocabulary 8192"
};
KvModelShape kv_model_shape(const KvExport& kv);
KvModelShape kv_model_shape(Engine& engine);

// Bounds a receiver puts on what a header may announce, checked before anything is allocated.
struct KvWireLimits {
  int max_layers = 1024;
  int max_tokens = 1 << 20;
  uint64_t max_layer_bytes = uint64_t{16} << 30;
  uint64_t max_total_bytes = uint64_t{64} << 30;  // all layers together
};

// A decoded header: the transfer's sequence without its K/V, and what the layers must be.
struct KvHeader {
  uint64_t transfer_id = 0;
  bool device_region = false;        // a region message follows instead of the layers
  KvExport meta;                     // every field but `layers`
  std::vector<uint64_t> layer_bytes; // [num_layers]
  std::vector<uint32_t> layer_crc;   // [num_layers]
};

// The header message of `kv` (computes every layer's checksum). kInvalidArgument when kv's layers
// disagree with its shape, kUnsupported for a dtype the format has no code for.
Result<std::vector<uint8_t>> encode_kv_header(const KvExport& kv, uint64_t transfer_id);
Result<KvHeader> decode_kv_header(std::span<const uint8_t> message, const KvWireLimits& limits);

// The region message of a transfer whose K/V are in device memory (kv.device), and its decoding.
struct KvRegionMessage {
  std::vector<uint8_t> handle;
  uint64_t offset = 0;
  uint64_t bytes = 0;
};
std::vector<uint8_t> encode_kv_region(const KvDeviceRegion& region, uint64_t transfer_id);
Result<KvRegionMessage> decode_kv_region(std::span<const uint8_t> message, uint64_t transfer_id);

// Sends one transfer: the header, then each layer as its own message (or, for K/V in device
// memory, the region message), all within `timeout`.
Status send_kv(KvTransport& transport, const KvExport& kv, uint64_t transfer_id, Millis timeout);

struct KvReceiveOptions {
  Millis wait_timeout{60000};  // for the header: how long to wait for a transfer to begin
  Millis timeout{30000};       // for the layers, from the header's arrival
  KvWireLimits limits;
  // The receiver's model: a header announcing another shape is kInvalidArgument, raised before
  // the layers are read (the transport must then be dropped).
  std::optional<KvModelShape> expect;
  // Maps a sender's device region (handle, offset, bytes) into this process, where the engine's
  // device reads it; null: such transfers are refused (kUnsupported).
  std::function<Result<KvDeviceRegion>(std::span<const uint8_t> handle, uint64_t offset, uint64_t bytes)> map_region;
};

struct ReceivedKv {
  uint64_t transfer_id = 0;
  KvImport kv;
};

// Receives one transfer and checks it whole: sizes, checksums, the expected shape.
Result<ReceivedKv> receive_kv(KvTransport& transport, const KvReceiveOptions& options);

// The decode side's answer to one transfer: Ok once adopted, else why not.
Status send_kv_ack(KvTransport& transport, uint64_t transfer_id, const Status& outcome, Millis timeout);
// The prefill side's wait for it: Ok, the decode side's error (its code, the message prefixed
// with "decode worker: "), or a transport or format error.
Status receive_kv_ack(KvTransport& transport, uint64_t transfer_id, Millis timeout);

}  // namespace tachyon::disagg
