//go:build ignore

// Writes go-durations.tsv: Go's time.ParseDuration answer for each input, the table that
// crds/src/duration.rs is tested against. Regenerate with
//
//	cd crds/testdata && go run go-durations.go > go-durations.tsv
package main

import (
	"encoding/json"
	"fmt"
	"time"
)

var inputs = []string{
	// What the spec's fields are written with.
	"30s", "5m", "1h", "24h", "1h30m", "1.5h", "2h45m", "300ms", "250ms", "1us", "1µs", "1μs",
	"1ns", "0", "0s", "-0", "+0", "-0s", "1h0m0s", "90m", "1m30s", "10s", "0.5s", ".5s", "1.s",
	"1.0s", "00001s", "1.000000000001s", "0.0000000001s", "1.9999999999999h",
	// Signs: Go accepts them (parse_duration refuses negative lengths afterwards).
	"-1s", "+1s", "-1.5h", "-1h30m", "+5m",
	// Refused by Go.
	"", "1", "10", "-", "+", "-0.", ".", ".s", "-.s", "s", "m5", "1d", "1w", "1y", "5 m", " 5m",
	"5m ", "1h-30m", "1h+30m", "1e3s", "1E3s", "1_000s", "1,5s", "0x10s", "1S", "1H", "1Ms",
	"1sec", "1 s", "1mm", "1hh", "NaN", "inf", "infs", "1h 30m", "1..5s", "1.5.5s", "--1s",
	"+-1s", "1µ", "1μ", "1u", "00", "-00", "0.0", "1.", "h1",
	// Limits: Go refuses past 2^63-1 ns (about 292 years) and accepts -2^63 ns.
	"9223372036854775807ns", "9223372036854775808ns", "-9223372036854775808ns",
	"-9223372036854775809ns", "2562047h", "2562048h", "2562047h47m16.854775807s",
	"2562047h47m16.854775808s", "-2562047h47m16.854775808s", "9223372036s", "9223372037s",
	"106751d", "18446744073709551616ns", "99999999999999999999s",
	"0.100000000000000000000h", "0.123456789012345678901234567890s",
	// Fractions of large units (Go's float64 arithmetic).
	"0.1h", "0.3h", "1.1h", "3.3333333h", "0.000000001h", "1.23456789s", "12.345678901ms",
	"0.5us", "0.5ns", "1.5ns",
}

func main() {
	fmt.Println("# Go's time.ParseDuration of each input (go run go-durations.go); do not edit.")
	fmt.Println("# <input as a JSON string>\\t<nanoseconds or error>")
	for _, in := range inputs {
		quoted, err := json.Marshal(in)
		if err != nil {
			panic(err)
		}
		d, err := time.ParseDuration(in)
		if err != nil {
			fmt.Printf("%s\terror\n", quoted)
		} else {
			fmt.Printf("%s\t%d\n", quoted, int64(d))
		}
	}
}
