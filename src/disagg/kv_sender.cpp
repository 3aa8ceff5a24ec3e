#include "disagg/kv_sender.h"

#include <fmt/format.h>

#include "core/log.h"
#include "disagg/kv_transfer.h"
#include "disagg/tcp_transport.h"

namespace tachyon::disagg {

std::string KvDestination::to_string() const {
  // A numeric IPv6 address needs brackets before the port.
  if (host.find(':') != std::string::npos) return fmt::format("[{}]:{}", host, port);
  return fmt::format("{}:{}", host, port);
}

KvSender::KvSender(KvSenderOptions options) : options_(options) {
  const int n = std::max(1, options_.num_threads);
  for (int i = 0; i < n; ++i) threads_.emplace_back([this] { run(); });
}

KvSender::~KvSender() { shutdown(); }

void KvSender::shutdown() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) {
    if (t.joinable()) t.join();
  }
  // Threads finish the job they hold; whatever is still queued fails here.
  std::deque<Job> left;
  {
    std::lock_guard lock(mu_);
    left.swap(queue_);
  }
  for (Job& job : left) job.done(make_error(ErrorCode::kIo, "kv transfer {}: the prefill worker is shutting down", job.transfer_id));
}

void KvSender::send(KvDestination to, uint64_t transfer_id, KvExport kv, Done done) {
  {
    std::lock_guard lock(mu_);
    if (!stop_) {
      queue_.push_back(Job{std::move(to), transfer_id, std::move(kv), std::move(done)});
      cv_.notify_one();
      return;
    }
  }
  done(make_error(ErrorCode::kIo, "kv transfer {}: the prefill worker is shutting down", transfer_id));
}

int KvSender::num_in_flight() const {
  std::lock_guard lock(mu_);
  return static_cast<int>(queue_.size()) + busy_;
}

Result<std::unique_ptr<TcpKvTransport>> KvSender::connection(const KvDestination& to) {
  const std::string key = to.to_string();
  for (;;) {
    std::unique_ptr<TcpKvTransport> conn;
    {
      std::lock_guard lock(mu_);
      auto it = idle_.find(key);
      if (it == idle_.end() || it->second.empty()) break;
      conn = std::move(it->second.back());
      it->second.pop_back();
    }
    // An idle decode worker sends nothing: readable means closed (or garbage); either way stale.
    auto readable = conn->wait_readable(Millis(1));
    if (readable.ok() && !*readable) return conn;
  }
  return TcpKvTransport::connect(to.host, to.port, options_.connect_timeout);
}

void KvSender::give_back(const KvDestination& to, std::unique_ptr<TcpKvTransport> conn) {
  std::lock_guard lock(mu_);
  auto& pool = idle_[to.to_string()];
  if (static_cast<int>(pool.size()) < options_.max_idle_per_address) pool.push_back(std::move(conn));
}

Status KvSender::ship(Job& job) {
  TACHYON_ASSIGN_OR_RETURN(std::unique_ptr<TcpKvTransport> conn, connection(job.to));
  TACHYON_RETURN_IF_ERROR(send_kv(*conn, job.kv, job.transfer_id, options_.send_timeout));
  job.kv = KvExport{};  // on the wire: keep nothing while the decode worker adopts
  // The ack's own status is the decode worker's answer; a transport error leaves `conn` broken.
  Status acked = receive_kv_ack(*conn, job.transfer_id, options_.ack_timeout);
  if (acked.ok() || acked.message().rfind("decode worker: ", 0) == 0) give_back(job.to, std::move(conn));
  return acked;
}

void KvSender::run() {
  for (;;) {
    Job job;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, nothing left
      if (stop_) return;           // the destructor fails what is queued
      job = std::move(queue_.front());
      queue_.pop_front();
      ++busy_;
    }
    Status st = ship(job);
    if (!st.ok()) {
      st = st.with_context(fmt::format("kv transfer {} to {}", job.transfer_id, job.to.to_string()));
      TACHYON_LOG_WARN("{}", st.to_string());
    }
    job.kv = KvExport{};
    job.done(st);
    std::lock_guard lock(mu_);
    --busy_;
  }
}

}  // namespace tachyon::disagg
