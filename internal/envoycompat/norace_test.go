//go:build !race

package envoycompat

// raceBuild: see race_test.go.
const raceBuild = false
