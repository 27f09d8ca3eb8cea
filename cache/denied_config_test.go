package cache

import (
	"errors"
	"strings"
	"testing"
)

func TestDeniedConfigValidate(t *testing.T) {
	valid := []DeniedConfig{
		{},
		{MaxEntries: 1},
		{MaxEntries: MaxDeniedEntries},
		{MaxBytes: MinDeniedBytes},
		{MaxBytes: MaxDeniedBytes},
	}
	for _, c := range valid {
		if err := c.Validate(); err != nil {
			t.Errorf("%+v.Validate() = %v, want nil", c, err)
		}
	}
	invalid := []struct {
		c     DeniedConfig
		field string
	}{
		{DeniedConfig{MaxEntries: 10, MaxBytes: 1 << 20}, "max entries and max bytes"},
		{DeniedConfig{MaxEntries: -1}, "max entries"},
		{DeniedConfig{MaxEntries: MaxDeniedEntries + 1}, "max entries"},
		{DeniedConfig{MaxBytes: -1}, "max bytes"},
		{DeniedConfig{MaxBytes: MinDeniedBytes - 1}, "max bytes"},
		{DeniedConfig{MaxBytes: MaxDeniedBytes + 1}, "max bytes"},
	}
	for _, tt := range invalid {
		err := tt.c.Validate()
		if !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%+v.Validate() = %v, want ErrInvalidConfig", tt.c, err)
			continue
		}
		if !strings.HasPrefix(err.Error(), tt.field+":") {
			t.Errorf("%+v.Validate() = %q, want it to start with the field %q", tt.c, err, tt.field)
		}
	}
}

func TestDeniedConfigSizing(t *testing.T) {
	tests := []struct {
		c                 DeniedConfig
		maxCost, counters int64
	}{
		{DeniedConfig{}, DefaultDeniedEntries, 10 * DefaultDeniedEntries},
		{DeniedConfig{MaxEntries: 7}, 7, 70},
		{DeniedConfig{MaxBytes: 1 << 20}, 1 << 20, 10 * ((1 << 20) / typicalEntryBytes)},
		{DeniedConfig{MaxBytes: MinDeniedBytes}, MinDeniedBytes, 10 * max(1, MinDeniedBytes/typicalEntryBytes)},
	}
	for _, tt := range tests {
		c := tt.c.withDefaults()
		if got := c.maxCost(); got != tt.maxCost {
			t.Errorf("%+v: maxCost = %d, want %d", tt.c, got, tt.maxCost)
		}
		if got := c.numCounters(); got != tt.counters {
			t.Errorf("%+v: numCounters = %d, want %d", tt.c, got, tt.counters)
		}
	}
}
