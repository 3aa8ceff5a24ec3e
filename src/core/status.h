// Status and Result<T>: the error type of every fallible call that a user's input can reach.
// Messages name the file and the field and carry the offending values ("model.gguf: tensor
// 'blk.0.attn_q.weight': offset 123456 + 4096 bytes is past the end of the file (100000 bytes)").
// Never abort on user input; asserts are for internal invariants only.
#pragma once

#include <cassert>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

#include <fmt/format.h>

namespace tachyon {

enum class ErrorCode {
  kOk = 0,
  kInvalidArgument,  // a caller's value is out of range or malformed
  kNotFound,         // a file, key or tensor is missing
  kCorruptFile,      // a file's bytes contradict its own format
  kUnsupported,      // well-formed but not handled (unknown architecture, dtype)
  kOutOfRange,       // e.g. prompt longer than the context
  kOutOfMemory,      // an allocation failed; the message holds the sizes
  kIo,               // the operating system refused (open, mmap, read)
  kInternal,         // a bug: an invariant failed in a way we can report
};

const char* error_code_name(ErrorCode code);

// The most bytes of a user's input that one error message quotes.
inline constexpr size_t kMaxEchoBytes = 200;
// `text` as an error message quotes it: whole if short, else its first kMaxEchoBytes bytes (cut
// at a UTF-8 character boundary) and "... (N bytes)". A message must never carry a whole file.
std::string excerpt(std::string_view text, size_t max_bytes = kMaxEchoBytes);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(ErrorCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }

  bool ok() const { return code_ == ErrorCode::kOk; }
  ErrorCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "corrupt file: model.gguf: ..." — what the CLI prints.
  std::string to_string() const;

  // Prepends context ("while loading X: ") to an error; a no-op on Ok.
  Status with_context(const std::string& context) const;

 private:
  ErrorCode code_ = ErrorCode::kOk;
  std::string message_;
};

template <typename... Args>
Status make_error(ErrorCode code, fmt::format_string<Args...> format, Args&&... args) {
  return Status(code, fmt::format(format, std::forward<Args>(args)...));
}

// Result<T> holds a value or a non-Ok Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : data_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : data_(std::move(status)) {  // NOLINT
    assert(!std::get<Status>(data_).ok() && "Result constructed from an Ok status");
  }

  bool ok() const { return std::holds_alternative<T>(data_); }
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<Status>(data_);
  }
  T& value() & { assert(ok()); return std::get<T>(data_); }
  const T& value() const& { assert(ok()); return std::get<T>(data_); }
  T&& value() && { assert(ok()); return std::get<T>(std::move(data_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::variant<T, Status> data_;
};

}  // namespace tachyon

#define TACHYON_CONCAT_INNER(a, b) a##b
#define TACHYON_CONCAT(a, b) TACHYON_CONCAT_INNER(a, b)

// Returns the Status from the enclosing function if `expr` (a Status) is not Ok.
#define TACHYON_RETURN_IF_ERROR(expr)                      \
  do {                                                     \
    ::tachyon::Status tachyon_status_ = (expr);            \
    if (!tachyon_status_.ok()) return tachyon_status_;     \
  } while (0)

// `TACHYON_ASSIGN_OR_RETURN(auto x, make_x());` — unwraps a Result or returns its Status.
#define TACHYON_ASSIGN_OR_RETURN(lhs, expr) \
  TACHYON_ASSIGN_OR_RETURN_IMPL(TACHYON_CONCAT(tachyon_result_, __LINE__), lhs, expr)
#define TACHYON_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                  \
  if (!tmp.ok()) return tmp.status();                 \
  lhs = std::move(tmp).value()

// Internal invariant: aborts with file:line and a message. Never for user input.
#define TACHYON_CHECK(cond, ...)                                                        \
  do {                                                                                  \
    if (!(cond)) ::tachyon::check_failed(__FILE__, __LINE__, #cond, fmt::format(__VA_ARGS__)); \
  } while (0)

namespace tachyon {
[[noreturn]] void check_failed(const char* file, int line, const char* cond, const std::string& message);
}
