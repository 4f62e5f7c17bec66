// The --http mode of modserve-loadgen: the same requests as server-sent-event streams from an
// OpenAI-compatible POST /v1/completions (modserve --http_port), one keep-alive connection per
// concurrency slot, each event timed as Boost.Beast's parser hands over the chunk it came in.
// It parses no JSON: an event whose choice has "finish_reason":null is one token.
#ifndef MODSERVE_CLIENTS_LOADGEN_HTTP_DRIVER_H_
#define MODSERVE_CLIENTS_LOADGEN_HTTP_DRIVER_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/time/time.h"

namespace modserve::loadgen {

struct HttpLoadResult {
  std::vector<double> ttft;           // seconds, one per successful request
  std::vector<double> itl;            // seconds, between consecutive token events
  int64_t tokens = 0;                 // token events received
  std::map<std::string, int> errors;  // failed requests by "HTTP <status>" or the socket error
  int32_t issued = 0;
  double wall_seconds = 0.0;
};

// `host_port` is "HOST:PORT" (an IP address); `bodies` are request bodies with "stream": true,
// sent in turn (request i gets bodies[i % size]). `concurrency` threads, `total` requests.
HttpLoadResult RunHttpLoad(const std::string& host_port, const std::vector<std::string>& bodies,
                           int32_t concurrency, int32_t total, absl::Duration timeout);

}  // namespace modserve::loadgen

#endif  // MODSERVE_CLIENTS_LOADGEN_HTTP_DRIVER_H_
