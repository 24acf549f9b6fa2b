// Plain TCP helpers shared by the agents' peer servers (the diagnostics
// network probe, node memory copies): blocking sockets with deadlines.
#pragma once

#include <cstddef>
#include <string>

#include "common/clock.h"

namespace trainguard {

// Every send and receive on `fd` fails after `timeout` without progress; no Nagle delay.
void SetDeadline(int fd, Nanos timeout);
// All of `n` bytes, or false (the peer went, or the deadline passed).
bool SendAll(int fd, const char* data, std::size_t n);
bool RecvAll(int fd, char* data, std::size_t n);
// A connected blocking socket to `peer` ("HOST:PORT", "[V6]:PORT"), with
// SetDeadline(timeout); -1 with `error` ("10.0.0.3:7000: connect: Connection refused").
int Connect(const std::string& peer, Nanos timeout, std::string* error);
// A listening socket on `address`:0 (any address if `address` is not an IPv4
// one) and its port, or -1 with `error`.
int Listen(const std::string& address, int* port, std::string* error);

}  // namespace trainguard
