// Which addresses are this host's: what a host of a multi-host job needs to
// know to decide whether it serves the rendezvous endpoint and which of its
// addresses its peers reach it at.
#pragma once

#include <string>

namespace trainguard {

// Splits "HOST:PORT" (IPv6 as "[ADDR]:PORT"); port -1 when there is none.
void SplitHostPort(const std::string& endpoint, std::string* host, int* port);

// Whether `host` (a name or an address) resolves to an address of this host
// (loopback included): one it can bind a socket to.
bool IsLocalAddress(const std::string& host);

// Whether a TCP listener could bind PORT on every address of this host now
// (IPv4's 0.0.0.0, or IPv6's [::] with `v6`).
bool CanListenOnPort(int port, bool v6);

// The address of this host that packets toward `host` leave from (its
// route's source), numeric; "" when `host` does not resolve or has no route.
std::string LocalAddressToward(const std::string& host);

}  // namespace trainguard
