// The in-process transport: two queues of messages, one per direction, shared by both ends.
#include "disagg/kv_transport.h"

#include <condition_variable>
#include <deque>
#include <mutex>

namespace tachyon::disagg {
namespace {

// One direction: messages from the writer to the reader, and whether either end closed.
struct Pipe {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::vector<uint8_t>> messages;
  bool closed = false;
};

class LocalTransport final : public KvTransport {
 public:
  LocalTransport(std::shared_ptr<Pipe> out, std::shared_ptr<Pipe> in) : out_(std::move(out)), in_(std::move(in)) {}
  ~LocalTransport() override { close(); }

  Status send(std::span<const uint8_t> message, Millis /*timeout: never blocks*/) override {
    if (broken_) return make_error(ErrorCode::kIo, "local transport: closed after an earlier error");
    std::lock_guard<std::mutex> lock(out_->mu);
    if (out_->closed) {
      broken_ = true;
      return make_error(ErrorCode::kIo, "local transport: the peer closed the channel");
    }
    out_->messages.emplace_back(message.begin(), message.end());
    out_->cv.notify_all();
    return Status::Ok();
  }

  Result<std::vector<uint8_t>> receive(size_t max_bytes, Millis timeout) override {
    if (broken_) return make_error(ErrorCode::kIo, "local transport: closed after an earlier error");
    std::unique_lock<std::mutex> lock(in_->mu);
    if (!in_->cv.wait_for(lock, timeout, [&] { return !in_->messages.empty() || in_->closed; })) {
      broken_ = true;
      return make_error(ErrorCode::kIo, "local transport: no message within {} ms", timeout.count());
    }
    if (in_->messages.empty()) {
      broken_ = true;
      return make_error(ErrorCode::kIo, "local transport: the peer closed the channel");
    }
    std::vector<uint8_t> message = std::move(in_->messages.front());
    in_->messages.pop_front();
    if (message.size() > max_bytes) {
      broken_ = true;
      return make_error(ErrorCode::kCorruptFile, "local transport: a message of {} bytes, at most {} expected",
                        message.size(), max_bytes);
    }
    return message;
  }

  void close() override {
    for (Pipe* p : {out_.get(), in_.get()}) {
      std::lock_guard<std::mutex> lock(p->mu);
      p->closed = true;
      p->cv.notify_all();
    }
  }

 private:
  std::shared_ptr<Pipe> out_;
  std::shared_ptr<Pipe> in_;
  bool broken_ = false;
};

}  // namespace

std::pair<std::unique_ptr<KvTransport>, std::unique_ptr<KvTransport>> make_local_transport_pair() {
  auto a_to_b = std::make_shared<Pipe>();
  auto b_to_a = std::make_shared<Pipe>();
  return {std::make_unique<LocalTransport>(a_to_b, b_to_a), std::make_unique<LocalTransport>(b_to_a, a_to_b)};
}

}  // namespace tachyon::disagg
