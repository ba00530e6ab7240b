"""Time constants of the hour-of-week model, in one place (pure constants: importing this loads nothing)."""

SECONDS_PER_MINUTE = 60
SECONDS_PER_HOUR = 3600.0
MINUTES_PER_HOUR = 60
HOURS_PER_DAY = 24
DAYS_PER_WEEK = 7
HOURS_PER_WEEK = HOURS_PER_DAY * DAYS_PER_WEEK  # 168: every profile and schedule has one value per hour of the week
MINUTES_PER_DAY = HOURS_PER_DAY * MINUTES_PER_HOUR
MINUTES_PER_WEEK = HOURS_PER_WEEK * MINUTES_PER_HOUR  # 10,080: Monday 00:00 = minute 0
