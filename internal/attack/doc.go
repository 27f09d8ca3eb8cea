// Package attack holds hostile clients of quotad,
// for tests that show its defences hold: hand-written HTTP/2 frames (rapid
// reset, trickled bodies), gzip decompression bombs and forged gossip
// packets. Test helper only: nothing outside tests imports it.
package attack
