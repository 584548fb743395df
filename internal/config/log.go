package config

import (
	"io"
	"log/slog"
)

// NewLogger returns a logger writing to w in c.Format (json unless "text")
// at c.Level (info when not one of debug, info, warn, error).
func NewLogger(c LogConfig, w io.Writer) *slog.Logger {
	var level slog.Level
	if level.UnmarshalText([]byte(c.Level)) != nil {
		level = slog.LevelInfo
	}
	opts := &slog.HandlerOptions{Level: level}
	if c.Format == "text" {
		return slog.New(slog.NewTextHandler(w, opts))
	}
	return slog.New(slog.NewJSONHandler(w, opts))
}
