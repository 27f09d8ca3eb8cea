//go:build race

package quotadtest

// raceEnabled: this binary runs under the race detector.
const raceEnabled = true
