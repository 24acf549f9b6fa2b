// The host of a precompiled header (CMakeLists.txt): nothing of its own.
int tg_pch_host_placeholder = 0;
