#include "router/response_sink.h"

#include <utility>

#include <fmt/format.h>

#include "net/http_response.h"

namespace tachyon::router {

using net::chunk;

std::string error_json_body(std::string message, std::string type, std::string code) {
  server::ApiError e;
  e.message = std::move(message);
  e.type = std::move(type);
  e.code = std::move(code);
  return error_body(e);
}

void ResponseSink::write_plain(int status, const std::string& body) {
  conn_.write(net::plain_response(status, "application/json", body, keep_alive_), write_timeout_);
  status_ = status;
}

void StreamSink::event(const std::string& data, const ojson& parsed) {
  // The workers always send usage; the client gets it only when it asked.
  if (!include_usage_ && parsed.is_object() && parsed.contains("usage") && !parsed["usage"].is_null() &&
      parsed.contains("choices") && parsed["choices"].is_array() && parsed["choices"].empty()) {
    return;
  }
  commit();
  conn_.write(chunk("data: " + data + "\n\n"), write_timeout_);
}

void StreamSink::done() {
  commit();
  conn_.write(chunk("data: [DONE]\n\n") + "0\r\n\r\n", write_timeout_);
}

void StreamSink::fail(int status, const std::string& message, const std::string& code) {
  const std::string body = error_json_body(message, status < 500 ? "invalid_request_error" : "server_error", code);
  if (!committed_) {
    committed_ = true;
    write_plain(status, body);
    return;
  }
  conn_.write(chunk("data: " + body + "\n\n" + "data: [DONE]\n\n") + "0\r\n\r\n", write_timeout_);
}

void StreamSink::commit() {
  if (committed_) return;
  committed_ = true;
  status_ = 200;
  conn_.write(net::status_line(200) +
                  fmt::format("Content-Type: text/event-stream; charset=utf-8\r\nCache-Control: no-cache\r\n"
                              "Transfer-Encoding: chunked\r\nConnection: {}\r\n\r\n",
                              keep_alive_ ? "keep-alive" : "close"),
              write_timeout_);
}

void PlainSink::event(const std::string& data, const ojson&) {
  if (!bad_.ok()) return;
  bad_ = assembler_.add(data);
}

void PlainSink::done() {
  if (!bad_.ok()) return fail(502, bad_.message(), "bad_worker_response");
  if (assembler_.failed()) return write_plain(assembler_.error_status(), assembler_.error_body());
  write_plain(200, assembler_.body());
}

void PlainSink::fail(int status, const std::string& message, const std::string& code) {
  write_plain(status, error_json_body(message, status < 500 ? "invalid_request_error" : "server_error", code));
}

}  // namespace tachyon::router
