#include "router/router_policy.h"

#include <algorithm>
#include <tuple>

namespace tachyon::router {
namespace {

bool excluded(std::span<const size_t> exclude, size_t i) {
  return std::find(exclude.begin(), exclude.end(), i) != exclude.end();
}

double free_fraction(const WorkerState& w) {
  return w.kv_blocks_total > 0 ? static_cast<double>(w.kv_blocks_free) / w.kv_blocks_total : 0.0;
}

}  // namespace

int decode_queue(const WorkerState& w) { return w.num_waiting + w.pending + w.assigned; }

bool decode_busy(const WorkerState& w, const RatePolicy& policy) {
  return decode_queue(w) >= policy.max_decode_queue || free_fraction(w) < policy.min_decode_free_kv;
}

WorkerPick pick_decode_worker(std::span<const WorkerState> workers, const RatePolicy& policy,
                              std::span<const size_t> exclude) {
  WorkerPick pick;
  bool any_live = false;
  std::tuple<int, double, size_t> best{0, 0.0, 0};
  for (size_t i = 0; i < workers.size(); ++i) {
    const WorkerState& w = workers[i];
    if (!w.up || excluded(exclude, i)) continue;
    any_live = true;
    if (decode_busy(w, policy)) continue;
    const std::tuple<int, double, size_t> key{decode_queue(w), -free_fraction(w), i};
    if (pick.kind != Pick::kChosen || key < best) {
      best = key;
      pick = {Pick::kChosen, i};
    }
  }
  if (pick.kind != Pick::kChosen) pick.kind = any_live ? Pick::kAllBusy : Pick::kNoneUp;
  return pick;
}

WorkerPick pick_prefill_worker(std::span<const WorkerState> workers, std::span<const size_t> exclude) {
  WorkerPick pick;
  int best = 0;
  for (size_t i = 0; i < workers.size(); ++i) {
    const WorkerState& w = workers[i];
    if (!w.up || excluded(exclude, i)) continue;
    const int queue = w.num_waiting + w.num_running + w.assigned;
    if (pick.kind != Pick::kChosen || queue < best) {
      best = queue;
      pick = {Pick::kChosen, i};
    }
  }
  return pick;
}

Admission admit(Pick decode, int num_held, const RatePolicy& policy) {
  switch (decode) {
    case Pick::kChosen: return Admission::kStart;
    case Pick::kAllBusy: return num_held < policy.max_held ? Admission::kHold : Admission::kRefuse;
    case Pick::kNoneUp: break;
  }
  return Admission::kRefuse;
}

}  // namespace tachyon::router
