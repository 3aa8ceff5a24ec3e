// Where a client request's answer goes: the workers always stream, and the router writes what
// the client asked for, as a stream of server-sent events (StreamSink) or as one response
// assembled from the chunks (PlainSink). Both answer an error with an HTTP status while nothing
// was sent yet, a stream with an error chunk and [DONE] after that.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "router/client_connection.h"
#include "server/openai_api.h"
#include "server/response_assembler.h"

namespace tachyon::router {

using ojson = nlohmann::ordered_json;

// An OpenAI error body: {"error": {"message", "type", "code"}}.
std::string error_json_body(std::string message, std::string type, std::string code);

class ResponseSink {
 public:
  virtual ~ResponseSink() = default;
  // One chunk's JSON for the client.
  virtual void event(const std::string& data, const ojson& parsed) = 0;
  // The last chunk went out ("data: [DONE]" for a stream).
  virtual void done() = 0;
  // Ends the request with an error (an HTTP status before anything was sent, else an error chunk).
  virtual void fail(int status, const std::string& message, const std::string& code) = 0;
  // Something reached the client: the request can no longer be retried.
  virtual bool committed() const = 0;
  bool client_gone() const { return conn_.gone; }
  // The HTTP status written, 0 while none was.
  int status() const { return status_; }

 protected:
  ResponseSink(ClientConnection& conn, double write_timeout, bool keep_alive)
      : conn_(conn), write_timeout_(write_timeout), keep_alive_(keep_alive) {}
  void write_plain(int status, const std::string& body);

  ClientConnection& conn_;
  double write_timeout_;
  bool keep_alive_;
  int status_ = 0;
};

class StreamSink final : public ResponseSink {
 public:
  StreamSink(ClientConnection& conn, double write_timeout, bool keep_alive, bool include_usage)
      : ResponseSink(conn, write_timeout, keep_alive), include_usage_(include_usage) {}
  void event(const std::string& data, const ojson& parsed) override;
  void done() override;
  void fail(int status, const std::string& message, const std::string& code) override;
  bool committed() const override { return committed_; }

 private:
  void commit();
  bool include_usage_;
  bool committed_ = false;
};

class PlainSink final : public ResponseSink {
 public:
  PlainSink(ClientConnection& conn, double write_timeout, bool keep_alive, server::Endpoint endpoint)
      : ResponseSink(conn, write_timeout, keep_alive), assembler_(endpoint) {}
  void event(const std::string& data, const ojson& parsed) override;
  void done() override;
  void fail(int status, const std::string& message, const std::string& code) override;
  bool committed() const override { return false; }  // nothing is written before the end

 private:
  server::ResponseAssembler assembler_;
  Status bad_;
};

}  // namespace tachyon::router
