// ResponseAssembler: one plain (not streamed) OpenAI response from the chunks of a streamed one,
// for the router, which reads every worker's part as a stream. Choices are merged by index: text
// (chat: the delta contents) and logprobs in order, the last finish_reason, the usage chunk. The
// result has the shape the server's own plain responses have (completion_job.h).
//
// Chunks are untrusted bytes from a worker: anything that is not a chunk of the expected shape is
// an error Status, never a crash; an {"error": ...} chunk makes the whole response that error.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "server/openai_api.h"

namespace tachyon::server {

class ResponseAssembler {
 public:
  explicit ResponseAssembler(Endpoint endpoint) : endpoint_(endpoint) {}

  // One chunk: the JSON of a "data:" line (not "[DONE]").
  Status add(std::string_view chunk);
  // An error chunk arrived: the response is that error, with a status chosen from its type.
  bool failed() const { return error_.has_value(); }
  int error_status() const;
  std::string error_body() const;
  // The plain response (after the last chunk).
  std::string body() const;
  // The HTTP status an error object of a streamed response stands for.
  static int status_of_error(const nlohmann::ordered_json& error);

 private:
  struct Choice {
    std::string text;
    nlohmann::ordered_json logprobs;  // null until a chunk carries some
    nlohmann::ordered_json finish_reason;
  };
  Endpoint endpoint_;
  std::string id_, model_;
  int64_t created_ = 0;
  std::map<int64_t, Choice> choices_;
  nlohmann::ordered_json usage_;
  std::optional<nlohmann::ordered_json> error_;
};

}  // namespace tachyon::server
