// The bytes of HTTP/1.1 responses as the server and the router write them: raw strings, so that a
// stream's head and first events can go out in one write.
#pragma once

#include <string>
#include <string_view>

namespace tachyon::net {

// "HTTP/1.1 200 OK\r\n".
std::string status_line(int status);
// One piece of a chunked body: its size in hex, the bytes, CRLF.
std::string chunk(std::string_view data);
// A whole response with a Content-Length body. `extra_headers`: more header lines, each ending in
// CRLF (CORS), or empty.
std::string plain_response(int status, std::string_view content_type, std::string_view body, bool keep_alive,
                           std::string_view extra_headers = {});

}  // namespace tachyon::net
