//go:build !race

package quotadtest

const raceEnabled = false
