DROP TABLE reaper_status;
