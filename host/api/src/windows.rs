//! Maintenance windows: when a rollout may start disrupting nodes.
//!
//! A window opens on chosen weekdays at a local time in an IANA time zone and closes at a
//! local end time (the next day when the end is not after the start) or after a duration.
//! Blackout dates, in each window's zone, keep a window from opening on them. Evaluation is
//! pure — the clock comes from the caller — and DST-aware: a window opening in a skipped
//! hour opens when the clock jumps, a `start`/`end` window follows the wall clock across a
//! change (a 22:00–04:00 window is an hour shorter on the night clocks go forward), a
//! `duration` window lasts exactly its duration.

use jiff::civil::{Date, Time, Weekday};
use jiff::tz::TimeZone;
use jiff::{SignedDuration, Timestamp, ToSpan as _};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// When disruptive work may start.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MaintenanceWindows {
    /// The windows: new disruptive work starts only while one is open.
    pub windows: Vec<Window>,
    /// Dates (`YYYY-MM-DD`, in each window's time zone) on which no window opens.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub blackout_dates: Vec<String>,
    /// Hold non-disruptive work (no interrupt, no drain) outside the windows too. Default:
    /// it runs any time.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub apply_to_all: bool,
}

/// One recurring window.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Window {
    /// Weekdays it opens on: `Mon`, `Tue`, `Wed`, `Thu`, `Fri`, `Sat`, `Sun`. Empty: every
    /// day.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub days: Vec<String>,
    /// Local opening time, `HH:MM`.
    pub start: String,
    /// Local closing time, `HH:MM`; at or before `start` it is the next day. Exclusive with
    /// `duration`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end: Option<String>,
    /// How long it stays open (`4h`, `90m`; at most 7 days). Exclusive with `end`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration: Option<String>,
    /// IANA time zone (`Europe/Berlin`). Default `UTC`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_zone: Option<String>,
}

/// The longest window.
const MAX_DURATION_SECS: i64 = 7 * 24 * 3600;

/// A window ready to evaluate.
#[derive(Clone, Debug)]
struct Parsed {
    days: Vec<Weekday>,
    start: Time,
    close: Close,
    tz: TimeZone,
}

#[derive(Clone, Copy, Debug)]
enum Close {
    At(Time),
    After(SignedDuration),
}

fn weekday(s: &str) -> Option<Weekday> {
    Some(match s {
        "Mon" => Weekday::Monday,
        "Tue" => Weekday::Tuesday,
        "Wed" => Weekday::Wednesday,
        "Thu" => Weekday::Thursday,
        "Fri" => Weekday::Friday,
        "Sat" => Weekday::Saturday,
        "Sun" => Weekday::Sunday,
        _ => return None,
    })
}

fn clock(s: &str) -> Option<Time> {
    let (h, m) = s.split_once(':')?;
    if h.len() != 2 || m.len() != 2 {
        return None;
    }
    Time::new(h.parse().ok()?, m.parse().ok()?, 0, 0).ok()
}

impl Window {
    fn parse(&self) -> Result<Parsed, (String, String)> {
        let mut days = Vec::new();
        for (i, d) in self.days.iter().enumerate() {
            days.push(weekday(d).ok_or_else(|| {
                (
                    format!("days[{i}]"),
                    format!("{d:?} is not one of Mon, Tue, Wed, Thu, Fri, Sat, Sun"),
                )
            })?);
        }
        let start = clock(&self.start).ok_or_else(|| {
            (
                "start".to_string(),
                format!("{:?} is not a time HH:MM", self.start),
            )
        })?;
        let close = match (&self.end, &self.duration) {
            (Some(end), None) => Close::At(
                clock(end)
                    .ok_or_else(|| ("end".to_string(), format!("{end:?} is not a time HH:MM")))?,
            ),
            (None, Some(d)) => {
                let secs = crate::units::parse_duration(d)
                    .map_err(|e| ("duration".to_string(), e))? as i64;
                if secs == 0 || secs > MAX_DURATION_SECS {
                    return Err((
                        "duration".into(),
                        format!("{d:?} must be more than 0 and at most 7 days"),
                    ));
                }
                Close::After(SignedDuration::from_secs(secs))
            }
            (Some(_), Some(_)) => {
                return Err(("end".into(), "set end or duration, not both".into()));
            }
            (None, None) => return Err(("end".into(), "set end (HH:MM) or duration".into())),
        };
        let name = self.time_zone.as_deref().unwrap_or("UTC");
        let tz = TimeZone::get(name).map_err(|e| {
            (
                "timeZone".to_string(),
                format!("{name:?} is not a known IANA time zone: {e}"),
            )
        })?;
        Ok(Parsed {
            days,
            start,
            close,
            tz,
        })
    }
}

impl Parsed {
    /// The window opening on local `date`, as `[open, close)`.
    fn on(&self, date: Date) -> Option<(Timestamp, Timestamp)> {
        if !self.days.is_empty() && !self.days.contains(&date.weekday()) {
            return None;
        }
        // A start in a skipped hour opens when the clock jumps (jiff's compatible choice).
        let open = date
            .to_datetime(self.start)
            .to_zoned(self.tz.clone())
            .ok()?
            .timestamp();
        let close = match self.close {
            Close::After(d) => open.checked_add(d).ok()?,
            Close::At(end) => {
                let day = if end > self.start {
                    date
                } else {
                    date.checked_add(1.day()).ok()?
                };
                day.to_datetime(end)
                    .to_zoned(self.tz.clone())
                    .ok()?
                    .timestamp()
            }
        };
        (close > open).then_some((open, close))
    }
}

/// The openings of `w` on the `days` local days from `from`, skipping blackout dates.
fn openings<'a>(
    w: &'a Parsed,
    blackout: &'a [Date],
    from: Date,
    days: i64,
) -> impl Iterator<Item = (Timestamp, Timestamp)> + 'a {
    (0..days)
        .filter_map(move |k| from.checked_add(k.days()).ok())
        .filter(|d| !blackout.contains(d))
        .filter_map(|d| w.on(d))
}

/// Where a rollout stands against its windows at some instant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WindowState {
    /// A window is open until this instant.
    Open {
        /// When it closes.
        until: Timestamp,
    },
    /// Every window is closed; the next opens then (`None`: within a year, none does).
    Closed {
        /// The next opening.
        next: Option<Timestamp>,
    },
}

impl MaintenanceWindows {
    /// Problems, each with its field path below the windows' own.
    pub fn validate(&self) -> Vec<(String, String)> {
        let mut errs = Vec::new();
        if self.windows.is_empty() {
            errs.push((
                "windows".into(),
                "needs at least one window (remove maintenanceWindows to allow any time)".into(),
            ));
        }
        for (i, w) in self.windows.iter().enumerate() {
            if let Err((field, message)) = w.parse() {
                errs.push((format!("windows[{i}].{field}"), message));
            }
        }
        for (i, d) in self.blackout_dates.iter().enumerate() {
            if d.parse::<Date>().is_err() {
                errs.push((
                    format!("blackoutDates[{i}]"),
                    format!("{d:?} is not a date YYYY-MM-DD"),
                ));
            }
        }
        errs
    }

    /// The state at `now`. Windows that do not parse never open (validation refuses them).
    pub fn at(&self, now: Timestamp) -> WindowState {
        let parsed: Vec<Parsed> = self.windows.iter().filter_map(|w| w.parse().ok()).collect();
        let blackout: Vec<Date> = self
            .blackout_dates
            .iter()
            .filter_map(|d| d.parse().ok())
            .collect();
        // Open: a window that opened on one of the last 8 local days is still open.
        let mut until: Option<Timestamp> = None;
        for w in &parsed {
            let today = now.to_zoned(w.tz.clone()).date();
            let Ok(from) = today.checked_sub(8.days()) else {
                continue;
            };
            for (open, close) in openings(w, &blackout, from, 9) {
                if open <= now && now < close {
                    until = Some(until.map_or(close, |u| u.max(close)));
                }
            }
        }
        if let Some(until) = until {
            return WindowState::Open { until };
        }
        let next = parsed
            .iter()
            .filter_map(|w| {
                let today = now.to_zoned(w.tz.clone()).date();
                openings(w, &blackout, today, 370)
                    .map(|(open, _)| open)
                    .find(|open| *open > now)
            })
            .min();
        WindowState::Closed { next }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn windows(ws: Vec<Window>) -> MaintenanceWindows {
        let w = MaintenanceWindows {
            windows: ws,
            ..Default::default()
        };
        assert_eq!(w.validate(), vec![]);
        w
    }

    fn nightly(tz: &str) -> Window {
        Window {
            start: "22:00".into(),
            end: Some("04:00".into()),
            time_zone: Some(tz.into()),
            ..Default::default()
        }
    }

    fn state(w: &MaintenanceWindows, now: &str) -> WindowState {
        w.at(at(now))
    }

    #[test]
    fn inside_outside_and_across_midnight() {
        let w = windows(vec![nightly("Europe/Berlin")]);
        // 2026-06-10: Berlin is UTC+2.
        assert_eq!(
            state(&w, "2026-06-10T19:59:00Z"),
            WindowState::Closed {
                next: Some(at("2026-06-10T20:00:00Z"))
            }
        );
        assert_eq!(
            state(&w, "2026-06-10T20:00:00Z"),
            WindowState::Open {
                until: at("2026-06-11T02:00:00Z")
            }
        );
        assert_eq!(
            state(&w, "2026-06-11T01:59:59Z"),
            WindowState::Open {
                until: at("2026-06-11T02:00:00Z")
            },
            "after midnight: the window of the day before"
        );
        assert_eq!(
            state(&w, "2026-06-11T02:00:00Z"),
            WindowState::Closed {
                next: Some(at("2026-06-11T20:00:00Z"))
            }
        );
    }

    #[test]
    fn weekdays_and_week_boundaries() {
        let mut fri = nightly("UTC");
        fri.days = vec!["Fri".into(), "Sun".into()];
        let w = windows(vec![fri]);
        // 2026-12-04 is a Friday; its window runs into Saturday morning.
        assert_eq!(
            state(&w, "2026-12-05T03:00:00Z"),
            WindowState::Open {
                until: at("2026-12-05T04:00:00Z")
            }
        );
        assert_eq!(
            state(&w, "2026-12-05T05:00:00Z"),
            WindowState::Closed {
                next: Some(at("2026-12-06T22:00:00Z"))
            },
            "Saturday: none; Sunday's next"
        );
        // Sunday's window runs into Monday, across the week boundary.
        assert_eq!(
            state(&w, "2026-12-07T01:00:00Z"),
            WindowState::Open {
                until: at("2026-12-07T04:00:00Z")
            }
        );
        assert_eq!(
            state(&w, "2026-12-07T04:00:00Z"),
            WindowState::Closed {
                next: Some(at("2026-12-11T22:00:00Z"))
            }
        );
    }

    #[test]
    fn dst_changes_follow_the_wall_clock_or_the_duration() {
        // Europe/Berlin: clocks go forward at 02:00 on 2026-03-29, back at 03:00 on 2026-10-25.
        let w = windows(vec![nightly("Europe/Berlin")]);
        // 22:00 CET (21:00Z) to 04:00 CEST (02:00Z): five hours, not six.
        assert_eq!(
            state(&w, "2026-03-28T21:00:00Z"),
            WindowState::Open {
                until: at("2026-03-29T02:00:00Z")
            }
        );
        // 22:00 CEST (20:00Z) to 04:00 CET (03:00Z): seven hours.
        assert_eq!(
            state(&w, "2026-10-24T20:00:00Z"),
            WindowState::Open {
                until: at("2026-10-25T03:00:00Z")
            }
        );
        assert_eq!(
            state(&w, "2026-10-25T02:30:00Z"),
            WindowState::Open {
                until: at("2026-10-25T03:00:00Z")
            }
        );

        // A duration is exact; a start in the skipped hour opens when the clock jumps.
        let gap = Window {
            start: "02:30".into(),
            duration: Some("1h".into()),
            time_zone: Some("Europe/Berlin".into()),
            ..Default::default()
        };
        let w = windows(vec![gap]);
        // 02:30 does not exist on 2026-03-29; the window opens at 03:30 CEST = 01:30Z.
        assert_eq!(
            state(&w, "2026-03-29T01:00:00Z"),
            WindowState::Closed {
                next: Some(at("2026-03-29T01:30:00Z"))
            }
        );
        assert_eq!(
            state(&w, "2026-03-29T01:30:00Z"),
            WindowState::Open {
                until: at("2026-03-29T02:30:00Z")
            }
        );
    }

    #[test]
    fn blackout_dates_and_several_windows() {
        let mut w = windows(vec![
            nightly("UTC"),
            Window {
                days: vec!["Sat".into()],
                start: "10:00".into(),
                duration: Some("2h".into()),
                time_zone: None,
                ..Default::default()
            },
        ]);
        w.blackout_dates = vec!["2026-12-24".into()];
        // The window of the 24th does not open; the 23rd's (running into the 24th) does.
        assert_eq!(
            state(&w, "2026-12-24T01:00:00Z"),
            WindowState::Open {
                until: at("2026-12-24T04:00:00Z")
            }
        );
        assert_eq!(
            state(&w, "2026-12-24T23:00:00Z"),
            WindowState::Closed {
                next: Some(at("2026-12-25T22:00:00Z"))
            }
        );
        // 2026-12-26 is a Saturday: the second window opens first.
        assert_eq!(
            state(&w, "2026-12-26T09:00:00Z"),
            WindowState::Closed {
                next: Some(at("2026-12-26T10:00:00Z"))
            }
        );
        assert_eq!(
            state(&w, "2026-12-26T11:00:00Z"),
            WindowState::Open {
                until: at("2026-12-26T12:00:00Z")
            }
        );
    }

    #[test]
    fn invalid_windows_name_their_field() {
        let bad = MaintenanceWindows {
            windows: vec![
                Window {
                    days: vec!["Monday".into()],
                    start: "25:00".into(),
                    end: Some("04:00".into()),
                    time_zone: Some("Mars/Olympus".into()),
                    ..Default::default()
                },
                Window {
                    start: "01:00".into(),
                    duration: Some("8d".into()),
                    ..Default::default()
                },
                Window {
                    start: "01:00".into(),
                    ..Default::default()
                },
            ],
            blackout_dates: vec!["24.12.2026".into()],
            apply_to_all: false,
        };
        let paths: Vec<String> = bad.validate().into_iter().map(|(p, _)| p).collect();
        assert_eq!(
            paths,
            [
                "windows[0].days[0]",
                "windows[1].duration",
                "windows[2].end",
                "blackoutDates[0]"
            ]
        );
        let tz = MaintenanceWindows {
            windows: vec![nightly("Mars/Olympus")],
            ..Default::default()
        };
        assert_eq!(tz.validate()[0].0, "windows[0].timeZone");
        assert_eq!(MaintenanceWindows::default().validate()[0].0, "windows");
    }
}
