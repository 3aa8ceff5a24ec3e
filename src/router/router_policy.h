// The router's decisions, as pure functions of what it knows about its workers: which decode
// worker takes a request, which prefill worker runs its prompt, and whether a new request may
// start now, waits (rate matching), or is refused. No I/O and no clocks: router.cpp feeds them
// the workers' last load reports and its own counts; tests feed them made-up ones.
//
// Rate matching: a decode worker is "busy" when its queue (waiting requests plus received
// transfers not yet adopted, plus requests the router sent it since its last report) reaches
// max_decode_queue, or its free KV blocks fall below min_decode_free_kv of its cache. When every
// live decode worker is busy, new requests are held before their prefill runs (shipping more KV to
// a full decode side would only pile it up), up to max_held at once; past that, or when no decode
// worker is up at all, they are refused (503).
#pragma once

#include <cstddef>
#include <optional>
#include <span>

namespace tachyon::router {

struct WorkerState {
  bool up = false;         // the last poll (or request) reached it
  int kv_blocks_total = 0;
  int kv_blocks_free = 0;
  int num_waiting = 0;     // its engine's queue
  int num_running = 0;
  int pending = 0;         // decode: transfers waiting for room; prefill: exports being shipped
  int assigned = 0;        // requests the router sent it since that report
};

struct RatePolicy {
  int max_decode_queue = 8;
  double min_decode_free_kv = 0.05;  // fraction of the decode worker's blocks
  int max_held = 64;                 // requests waiting for a decode worker at once
};

// What the router counts as a decode worker's queue.
int decode_queue(const WorkerState& w);
bool decode_busy(const WorkerState& w, const RatePolicy& policy);

enum class Pick { kChosen, kAllBusy, kNoneUp };
struct WorkerPick {
  Pick kind = Pick::kNoneUp;
  size_t index = 0;  // with kChosen
};

// The live, not busy, not excluded decode worker with the shortest queue; among equals, the most
// free KV blocks (as a fraction of its cache), then the lowest index. kAllBusy when some live,
// not excluded worker exists but every such one is busy; kNoneUp when there is none.
WorkerPick pick_decode_worker(std::span<const WorkerState> workers, const RatePolicy& policy,
                              std::span<const size_t> exclude = {});
// The live, not excluded prefill worker with the shortest queue (waiting + running + assigned),
// then the lowest index; kNoneUp when there is none.
WorkerPick pick_prefill_worker(std::span<const WorkerState> workers, std::span<const size_t> exclude = {});

enum class Admission { kStart, kHold, kRefuse };
// A new request, given the decode pick and how many requests are held now.
Admission admit(Pick decode, int num_held, const RatePolicy& policy);

}  // namespace tachyon::router
